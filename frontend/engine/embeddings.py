"""embed() and score_tokens(): vectors from the served model itself, in prefill-only requests (the routes:
frontend/api/embedding_routes.py, frontend/api/rerank_routes.py, Ollama's /api/embed and /api/rerank).

An embedding is the model's final hidden states (after the final norm), mean-pooled over the input's tokens and
then L2-normalised (SamplingParams.embed): nothing is taken from or kept for the prefix cache's sake, and its KV
blocks are freed as soon as it finishes. A generative model's pooled states are not a trained sentence embedding:
good for comparing texts under one model, not comparable with another model's vectors.
A score is the logits of a few tokens at the input's last position (SamplingParams.score_token_ids; a reranker's
"yes" and "no"): its prompt may start from cached blocks, as a generation's does. Neither samples a token.
"""
import asyncio
import uuid

from tinyvllm.frontend.engine.request_errors import EngineRequestError
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.protocol.sampling import SamplingParams


async def _pooled(engine, token_id_lists: list[list[int]], make_sampling, what: str,
                  id_prefix: str) -> list[list[float]]:
    """One vector per token id list, computed concurrently; raises EngineRequestError if the engine refuses one."""
    async def one(ids: list[int]) -> list[float]:
        vector = None
        async for out in engine.generate(f"{id_prefix}-{uuid.uuid4().hex}", ids, make_sampling(), []):
            if out.finish_reason == FinishReason.ERROR:
                raise EngineRequestError.from_output(out, f"the engine could not compute this {what}")
            vector = out.embedding if out.embedding is not None else vector
        if vector is None:
            raise EngineRequestError(f"the engine returned no {what}")
        return vector

    try:
        async with asyncio.TaskGroup() as group:  # one failure cancels (and so aborts) the rest
            tasks = [group.create_task(one(ids)) for ids in token_id_lists]
    except ExceptionGroup as failures:
        raise failures.exceptions[0] from None
    return [t.result() for t in tasks]


async def embed(engine, token_id_lists: list[list[int]]) -> list[list[float]]:
    return await _pooled(engine, token_id_lists, lambda: SamplingParams(embed=True, max_tokens=1), "embedding",
                         "embd")


async def score_tokens(engine, token_id_lists: list[list[int]], token_ids: list[int]) -> list[list[float]]:
    """Per list, the logits of token_ids at its last position."""
    return await _pooled(engine, token_id_lists, lambda: SamplingParams(score_token_ids=list(token_ids), max_tokens=1),
                         "score", "scor")
