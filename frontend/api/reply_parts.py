"""One choice's streamed reply as the pieces Anthropic's and the Responses API's replies are made of: thinking text,
answer text (tool calls taken out of it) and, at the end, the calls and the last delta (frontend/api/serving.py's
TextDelta: finish reason and token counts)."""
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass, field

from tinyvllm.frontend.api.tool_calls import ToolCall, ToolCallText


@dataclass(slots=True)
class ReplyEnd:
    calls: list[ToolCall] = field(default_factory=list)
    last: object = None  # the last TextDelta, None when there was none


async def reply_parts(deltas: AsyncIterator, parse_calls: bool) -> AsyncIterator[tuple[str, str] | ReplyEnd]:
    """("thinking", text) and ("answer", text) in the order they came, then one ReplyEnd."""
    calls_text, end = ToolCallText() if parse_calls else None, ReplyEnd()
    async with aclosing(deltas):
        async for end.last in deltas:
            if end.last.reasoning:
                yield "thinking", end.last.reasoning
            text = calls_text.feed(end.last.text) if calls_text else end.last.text
            if end.last.finish_reason is not None and calls_text is not None:
                rest, end.calls = calls_text.finish()
                text += rest
            if text:
                yield "answer", text
    yield end


async def reply_events(deltas: AsyncIterator, parse_calls: bool, write: Callable[[str, str], Iterable],
                       finish: Callable[[ReplyEnd], Iterable]) -> AsyncIterator:
    """The events `write` makes of each part in order, then those `finish` makes of the ReplyEnd."""
    end = ReplyEnd()
    async with aclosing(reply_parts(deltas, parse_calls)) as parts:  # closed (the request aborted) if we are
        async for part in parts:
            if isinstance(part, ReplyEnd):
                end = part
                continue
            for event in write(*part):
                yield event
    for event in finish(end):
        yield event
