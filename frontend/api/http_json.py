"""JSON request bodies (size-bounded, strict), OpenAI-shaped error responses, and the client-disconnect watcher, shared
by every route module (the OpenAI and the Ollama ones)."""
import asyncio
import json
import logging
from collections.abc import Coroutine
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.engine.request_errors import EngineRequestError

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"; nobody reads it, but logs do
log = logging.getLogger(__name__)


def error_response(exc: api.APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def exception_response(exc: Exception, path: str) -> JSONResponse:
    """What an OpenAI route answers for an exception it raised: its APIError as is, a dead engine 503, a request
    the engine ended with an error its kind's status (frontend/engine/request_errors.py), anything else 500 (logged with
    its traceback)."""
    if isinstance(exc, api.APIError):
        return error_response(exc)
    if isinstance(exc, EngineDeadError):
        return error_response(api.APIError(f"The engine is not available: {exc}", 503, "ServiceUnavailableError"))
    if isinstance(exc, EngineRequestError):
        return error_response(api.api_error_of(exc))
    log.error("unexpected error serving %s", path, exc_info=exc)
    return error_response(api.APIError("Internal server error", 500, "InternalServerError"))


def _reject_non_finite(constant: str) -> float:
    raise ValueError(f"{constant} is not a valid JSON number")


async def read_bounded_body(request: Request, max_bytes: int, too_large: Exception) -> bytes:
    """The raw body, raising `too_large` as soon as it is declared or streamed past max_bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_body(request: Request, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Any:
    too_large = api.APIError(f"The request body is larger than {max_bytes} bytes", 413, "RequestEntityTooLargeError")
    raw = await read_bounded_body(request, max_bytes, too_large)
    try:
        return json.loads(raw, parse_constant=_reject_non_finite)
    except (ValueError, RecursionError) as e:
        raise api.APIError(f"The request body is not valid JSON: {e}"[:500]) from None


async def read_json_object(request: Request, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> dict:
    body = await read_json_body(request, max_bytes)
    if not isinstance(body, dict):
        raise api.APIError("The request body must be a JSON object")
    return body


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_unless_disconnected(request: Request, work: Coroutine) -> tuple[bool, Any]:
    """Runs `work` while watching for the client to leave (the body must already be read).

    Returns (True, result), or (False, None) after cancelling `work` because the client went away.
    """
    work_task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait((work_task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work_task.done():
            work_task.cancel()
            await asyncio.gather(work_task, return_exceptions=True)
    if work_task.cancelled():
        return False, None
    return True, work_task.result()
