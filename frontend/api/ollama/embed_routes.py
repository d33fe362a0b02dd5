"""POST /api/embed (normalized, batched, truncated to the context) and the older POST /api/embeddings.

The vectors come from the served model through frontend/engine/embeddings.embed(engine, token_id_lists) (mean-pooled
final hidden states; see there), or `engine.embed(token_id_lists)` if the engine has one. Without either, both
routes answer 501.
"""
from __future__ import annotations

import inspect
import math
import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.api.ollama import prompting
from tinyvllm.frontend.api.ollama.http_io import OllamaError, handler, read_request
from tinyvllm.frontend.api.ollama.requests import EmbeddingsRequest, EmbedRequest
from tinyvllm.frontend.api.ollama.service import OllamaService
from tinyvllm.frontend.engine.request_errors import EngineRequestError

Embedder = Callable[[list[list[int]]], Awaitable[list[list[float]]]]


def find_embedder(engine) -> Embedder | None:
    """`engine.embed(ids)`, else frontend/engine/embeddings.embed(ids) or embed(engine, ids); None if neither
    exists."""
    if callable(method := getattr(engine, "embed", None)):
        return method
    try:
        from tinyvllm.frontend.engine import embeddings
    except ImportError:
        return None
    fn = getattr(embeddings, "embed", None)
    if not callable(fn):
        return None
    if len(inspect.signature(fn).parameters) >= 2:
        return lambda ids: fn(engine, ids)
    return fn


def normalized(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else list(vector)


def make_routes(service: OllamaService):
    tokenizer = service.tokenizer

    async def vectors_of(batch: list[list[int]]) -> list[list[float]]:
        if (embed := find_embedder(service.engine)) is None:
            raise OllamaError("embeddings are not available on this server yet (its engine has no embedding "
                              "function)", 501)
        if service.engine.dead_reason is not None:
            raise EngineDeadError(service.engine.dead_reason)
        try:
            return await embed(batch)
        except EngineDeadError:
            raise
        except EngineRequestError as e:
            raise OllamaError(f"the engine could not compute the embeddings: {e}", e.status) from None
        except RuntimeError as e:  # an engine's own embed() method
            raise OllamaError(f"the engine could not compute the embeddings: {e}", 500) from None

    async def token_ids(text: str, truncate: bool) -> list[int]:
        ids = await prompting.encode(tokenizer, text, True)
        if len(ids) > service.max_model_len:
            if not truncate:
                raise OllamaError(f"input length ({len(ids)} tokens) exceeds the maximum context length "
                                  f"({service.max_model_len})")
            ids = ids[: service.max_model_len]
        return ids

    @handler
    async def embed(request: Request) -> Response:
        received = time.perf_counter_ns()
        req = await read_request(request, EmbedRequest, service.max_body_bytes)
        name, dimensions, truncate = req.model_name, req.dimensions, req.truncate
        await service.servable(name)
        inputs = [req.input] if isinstance(req.input, str) else req.input
        inputs = [s for s in inputs if s]
        if not inputs:
            return JSONResponse({"model": name, "embeddings": []})
        batch = [await token_ids(s, truncate) for s in inputs]
        loaded = time.perf_counter_ns()
        vectors = await vectors_of(batch)
        if dimensions is not None:
            if dimensions > len(vectors[0]):
                raise OllamaError(f"'dimensions' ({dimensions}) is larger than the model's ({len(vectors[0])})")
            vectors = [v[:dimensions] for v in vectors]
        return JSONResponse({"model": name, "embeddings": [normalized(list(v)) for v in vectors],
                             "total_duration": time.perf_counter_ns() - received,
                             "load_duration": loaded - received,
                             "prompt_eval_count": sum(len(ids) for ids in batch)})

    @handler
    async def embeddings(request: Request) -> Response:
        req = await read_request(request, EmbeddingsRequest, service.max_body_bytes)
        await service.servable(req.model_name)
        prompt = req.prompt
        if not prompt:
            return JSONResponse({"embedding": []})
        (vector,) = await vectors_of([await token_ids(prompt, True)])
        return JSONResponse({"embedding": list(vector)})

    return embed, embeddings
