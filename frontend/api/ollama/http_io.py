"""Ollama's HTTP conventions: `{"error": "..."}` bodies, NDJSON streams, bounded JSON bodies, RFC3339 times."""
from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tinyvllm.frontend.api.http_json import CLIENT_CLOSED_REQUEST, read_bounded_body, run_unless_disconnected
from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.api.ollama.go_template import TemplateError
from tinyvllm.frontend.api.ollama.model_store import StoreError, now_rfc3339
from tinyvllm.frontend.api.ollama.modelfile import ModelfileError
from tinyvllm.frontend.api.ollama.options import OptionError
from tinyvllm.frontend.api.openai_protocol import APIError
from tinyvllm.frontend.api.request_models import RequestInvalid, RequestModel, validate
from tinyvllm.frontend.engine.request_errors import EngineRequestError

log = logging.getLogger(__name__)
NDJSON = "application/x-ndjson"

timestamp = now_rfc3339


class OllamaError(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


def error_response(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def as_ollama_error(exc: Exception) -> OllamaError:
    """The error a client sees for anything a handler raised."""
    if isinstance(exc, OllamaError):
        return exc
    if isinstance(exc, StoreError):
        return OllamaError(str(exc), exc.status)
    if isinstance(exc, (RequestInvalid, OptionError, ModelfileError, TemplateError)):
        return OllamaError(str(exc), 400)
    if isinstance(exc, APIError):
        return OllamaError(exc.message, exc.status)
    if isinstance(exc, EngineDeadError):
        return OllamaError(f"the engine is not available: {exc}", 503)
    if isinstance(exc, EngineRequestError):
        return OllamaError(exc.client_message, exc.status)
    log.error("unexpected error in an Ollama route", exc_info=exc)
    return OllamaError("internal server error", 500)


def handler(fn: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """Turns whatever `fn` raises into Ollama's error shape and status."""
    @functools.wraps(fn)
    async def wrapped(*args: Any) -> Response:
        try:
            return await fn(*args)
        except Exception as e:
            err = as_ollama_error(e)
            return error_response(err.message, err.status)
    return wrapped


async def read_request(request: Request, model: type[RequestModel], max_bytes: int) -> Any:
    """The JSON body, validated as `model` (RequestInvalid, a 400, if it is not)."""
    raw = await read_bounded_body(request, max_bytes, OllamaError(f"request body is larger than {max_bytes} bytes", 413))
    if not raw.strip():
        raise OllamaError("missing request body")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise OllamaError(f"invalid JSON in request body: {e}"[:300]) from None
    if not isinstance(body, dict):
        raise OllamaError("the request body must be a JSON object")
    return validate(model, body)


def ndjson_line(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


async def _first(items: AsyncIterator[dict]) -> dict | None:
    try:
        return await anext(items)
    except StopAsyncIteration:
        return None


async def streamed(request: Request, items: AsyncIterator[dict]) -> Response:
    """NDJSON, as Ollama streams: an error before the first item gets its own status; later, an error line."""
    finished, first = await run_unless_disconnected(request, _first(items))
    if not finished:
        await items.aclose()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if first is None:
        return Response(b"", media_type=NDJSON)

    async def body() -> AsyncIterator[bytes]:
        try:
            yield ndjson_line(first)
            async for item in items:
                yield ndjson_line(item)
        except Exception as e:
            yield ndjson_line({"error": as_ollama_error(e).message})
        finally:
            await items.aclose()

    return StreamingResponse(body(), media_type=NDJSON)


def status_reply(statuses: list[dict], stream: bool) -> Response:
    """/api/create and /api/pull: the progress lines as NDJSON, or just the last one."""
    if not stream:
        return JSONResponse(statuses[-1])
    return Response(b"".join(ndjson_line(s) for s in statuses), media_type=NDJSON)
