"""POST /v1/embeddings, in OpenAI's shape, over the engine's embed() (frontend/engine/embeddings.py)."""
import asyncio
import base64
import time
import uuid

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api import openapi
from tinyvllm.frontend.api.http_json import exception_response, read_json_object
from tinyvllm.frontend.api.openai_requests import EmbeddingRequest
from tinyvllm.frontend.api.openai_responses import EmbeddingResponse
from tinyvllm.frontend.engine.embeddings import embed
from tinyvllm.frontend.engine.engine_client import EngineDeadError


def _inputs(req: EmbeddingRequest) -> list[str | list[int]]:
    """OpenAI's input (a string, a list of strings, a list of token ids, or a list of such lists) as a list."""
    single = isinstance(req.input, str) or isinstance(req.input[0], int)
    return [req.input] if single else req.input


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # little-endian float32, as the openai client decodes it
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def embedding_routes(engine, tokenizer, model_name: str, max_model_len: int, max_body_bytes: int) -> list[Route]:
    async def tokenized(item: str | list[int]) -> list[int]:
        if isinstance(item, str):
            return await asyncio.to_thread(tokenizer.encode, item, True) if len(item) > 4096 else \
                tokenizer.encode(item, True)
        if (bad := next((t for t in item if not 0 <= t < tokenizer.vocab_size), None)) is not None:
            raise api.APIError(f"Token id {bad} in 'input' is out of vocabulary (size {tokenizer.vocab_size})",
                               param="input")
        return item

    async def embeddings(request: Request) -> Response:
        try:
            req = api.validated(EmbeddingRequest, await read_json_object(request, max_body_bytes))
            if req.model is not None and req.model != model_name:
                raise api.model_not_found(req.model)
            inputs, encoding_format = _inputs(req), req.encoding_format
            if req.dimensions is not None:
                raise api.APIError(f'Model "{model_name}" does not support matryoshka representation, changing '
                                   f"output dimensions will lead to poor results.", param="dimensions")
            if engine.dead_reason is not None:
                raise EngineDeadError(engine.dead_reason)
            batch = [await tokenized(item) for item in inputs]
            for ids in batch:
                if not ids:
                    raise api.APIError("The input is empty", param="input")
                if len(ids) > max_model_len:
                    raise api.APIError(f"This model's maximum context length is {max_model_len} tokens. However, you "
                                       f"requested {len(ids)} tokens in the input for embedding generation. Please "
                                       f"reduce the length of the input.", param="input")
            vectors = await embed(engine, batch)
        except Exception as e:
            return exception_response(e, request.url.path)
        num_tokens = sum(len(ids) for ids in batch)
        return JSONResponse({
            "id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model_name,
            "data": [{"index": i, "object": "embedding", "embedding": encode_vector(v, encoding_format)}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        })

    return [Route("/v1/embeddings", embeddings, methods=["POST"])]


openapi.describe("/v1/embeddings", "POST", EmbeddingRequest, EmbeddingResponse,
                 summary="Embeddings: the model's mean-pooled, normalised final hidden states",
                 error_statuses=(400, 404, 413, 500, 503, 504))
