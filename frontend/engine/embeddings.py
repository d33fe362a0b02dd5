"""embed(): vectors from the served model itself (the routes: frontend/api/embedding_routes.py, Ollama's /api/embed).

An embedding is the model's final hidden states (after the final norm), mean-pooled over the input's tokens and
then L2-normalised. The worker computes it in a prefill-only request (SamplingParams.embed): no token is
sampled, nothing is taken from or kept for the prefix cache's sake, and its KV blocks are freed as soon as it
finishes. A generative model's pooled states are not a trained sentence embedding: good for comparing texts
under one model, not comparable with another model's vectors.
"""
import asyncio
import uuid

from tinyvllm.frontend.engine.request_errors import EngineRequestError
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.protocol.sampling import SamplingParams


async def embed(engine, token_id_lists: list[list[int]]) -> list[list[float]]:
    """One vector per token id list, computed concurrently; raises EngineRequestError if the engine refuses one."""
    async def one(ids: list[int]) -> list[float]:
        vector = None
        async for out in engine.generate(f"embd-{uuid.uuid4().hex}", ids, SamplingParams(embed=True, max_tokens=1), []):
            if out.finish_reason == FinishReason.ERROR:
                raise EngineRequestError.from_output(out, "the engine could not compute this embedding")
            vector = out.embedding if out.embedding is not None else vector
        if vector is None:
            raise EngineRequestError("the engine returned no embedding")
        return vector

    try:
        async with asyncio.TaskGroup() as group:  # one failure cancels (and so aborts) the rest
            tasks = [group.create_task(one(ids)) for ids in token_id_lists]
    except ExceptionGroup as failures:
        raise failures.exceptions[0] from None
    return [t.result() for t in tasks]
