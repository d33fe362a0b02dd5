"""Server-sent events for streamed completions and chat, framed as vLLM does: `data: <json>\\n\\n`, then [DONE]."""
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.engine.request_errors import EngineRequestError
from tinyvllm.frontend.api.serving import TextDelta

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


def sse_event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class SSEResponse(StreamingResponse):
    """A StreamingResponse that always closes its event generator, so a client leaving aborts the request."""
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes]):
        super().__init__(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Starlette stops iterating on disconnect but leaves the generator to the garbage collector.
            await self.body_iterator.aclose()


class EventStream(SSEResponse):
    """An SSE response that calls on_close however it ends (even before its generator started)."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]):
        super().__init__(events)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


class StreamSlots:
    """At most `limit` endless event streams of one route at once; past them, 503 with Retry-After and `refusal`."""

    def __init__(self, limit: int, refusal: str):
        self.limit, self.refusal, self.open = limit, refusal, 0

    def stream(self, start: Callable[[], tuple[AsyncIterator[bytes], Callable[[], None]]]) -> Response:
        """start() -> (the events, what to do when the stream ends), called only when a slot is free."""
        if self.open >= self.limit:
            busy = api.error_body(self.refusal, "ServiceUnavailableError", 503)
            return JSONResponse(busy, status_code=503, headers={"Retry-After": "5"})
        events, ended = start()
        self.open += 1

        def closed() -> None:
            self.open -= 1
            ended()
        return EventStream(events, closed)


def stream_error_event(exc: Exception) -> bytes:
    if isinstance(exc, EngineRequestError):
        return sse_event(api.api_error_of(exc).body())
    if isinstance(exc, EngineDeadError):
        return sse_event(api.error_body(f"The engine is not available: {exc}", "ServiceUnavailableError", 503))
    if isinstance(exc, api.APIError):
        return sse_event(exc.body())
    log.exception("error while streaming a response")
    return sse_event(api.error_body("Internal server error", "InternalServerError", 500))


async def completion_events(deltas: AsyncIterator[TextDelta], request_id: str, model: str, created: int,
                            include_usage: bool, n: int = 1) -> AsyncIterator[bytes]:
    # n is unused: completions have no per-choice opening chunk (it keeps the signature of chat_events).
    def chunk(delta: TextDelta) -> dict:
        return api.completion_chunk(request_id, model, created, delta.text, delta.finish_reason, delta.stop_reason,
                                    delta.index, delta.logprobs)

    async for event in _events(deltas, chunk, [], request_id, "text_completion", model, created, include_usage):
        yield event


async def chat_events(deltas: AsyncIterator[TextDelta], request_id: str, model: str, created: int,
                      include_usage: bool, n: int = 1) -> AsyncIterator[bytes]:
    def chunk(delta: TextDelta) -> dict:
        content = {"content": delta.text} if delta.text or (delta.finish_reason is None and not delta.reasoning) else {}
        content.update(api.reasoning_fields(delta.reasoning or None))
        if delta.tool_calls:
            content["tool_calls"] = delta.tool_calls
        return api.chat_chunk(request_id, model, created, content, delta.finish_reason, delta.stop_reason,
                              delta.index, delta.logprobs)

    # As vLLM does: every choice's first chunk carries the role, sent before any token is generated.
    role_chunks = [api.chat_chunk(request_id, model, created, {"role": "assistant", "content": ""}, index=i)
                   for i in range(n)]
    async for event in _events(deltas, chunk, role_chunks, request_id, "chat.completion.chunk", model, created,
                               include_usage):
        yield event


async def _events(deltas, make_chunk, first_chunks, request_id, object_type, model, created, include_usage):
    """Interleaved chunks of every choice (choices[0].index tells which), each choice ending with its own
    finish_reason chunk; then the usage chunk if asked for, and [DONE] once, after every choice finished."""
    def with_usage_field(chunk: dict) -> dict:
        return {**chunk, "usage": None} if include_usage else chunk

    async with aclosing(deltas):
        try:
            for first in first_chunks:
                yield sse_event(with_usage_field(first))
            last = None
            async for last in deltas:
                yield sse_event(with_usage_field(make_chunk(last)))
            if include_usage and last is not None:
                usage = api.usage_body(last.num_prompt_tokens, last.num_generated_tokens, last.num_cached_tokens)
                yield sse_event(api.usage_chunk(request_id, object_type, model, created, usage))
        except Exception as exc:
            yield stream_error_event(exc)
        yield DONE
