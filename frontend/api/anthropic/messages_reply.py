"""A Messages reply as Anthropic's event sequence, made from the chat path's TextDeltas (thinking already apart:
frontend/api/reasoning.py): message_start, ping, then per content block content_block_start, its deltas
(thinking_delta, text_delta, input_json_delta) and content_block_stop, then message_delta (stop_reason, usage) and
message_stop. A whole reply is the same events folded into one message, so both are built by one piece of code."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing

from tinyvllm.frontend.api.reply_parts import ReplyEnd, reply_events

Event = tuple[str, dict]
_DELTA_FIELD = {"text": ("text_delta", "text"), "thinking": ("thinking_delta", "thinking")}


def _usage(prompt_tokens: int, output_tokens: int, cached: int) -> dict:
    """Anthropic counts a prompt as input_tokens + cache_read_input_tokens (+ cache_creation_input_tokens): the
    prefix cache's tokens are not input_tokens too."""
    return {"input_tokens": prompt_tokens - cached, "output_tokens": output_tokens, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0}


class _Blocks:
    """The content blocks written so far: a new block starts where the kind of text changes."""

    def __init__(self):
        self.count, self.open = 0, None

    def write(self, kind: str, text: str) -> list[Event]:
        events = []
        if self.open != kind:
            events += self.close()
            start = {"type": kind, kind: "", **({"signature": ""} if kind == "thinking" else {})}
            events.append(("content_block_start", {"type": "content_block_start", "index": self.count,
                                                   "content_block": start}))
            self.open = kind
        delta_type, field = _DELTA_FIELD[kind]
        return events + [("content_block_delta", {"type": "content_block_delta", "index": self.count,
                                                  "delta": {"type": delta_type, field: text}})]

    def close(self) -> list[Event]:
        if self.open is None:
            return []
        self.open, self.count = None, self.count + 1
        return [("content_block_stop", {"type": "content_block_stop", "index": self.count - 1})]

    def tool_use(self, call) -> list[Event]:
        index, self.count = self.count, self.count + 1
        return [("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                    "type": "tool_use", "id": call.id, "name": call.name, "input": {}}}),
                ("content_block_delta", {"type": "content_block_delta", "index": index,
                                         "delta": {"type": "input_json_delta", "partial_json": call.arguments}}),
                ("content_block_stop", {"type": "content_block_stop", "index": index})]


def _stop(finish_reason: str | None, stop_reason, called: bool) -> tuple[str, str | None]:
    if finish_reason == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    return ("stop_sequence", stop_reason) if isinstance(stop_reason, str) else ("end_turn", None)


async def message_events(deltas: AsyncIterator, message_id: str, model: str, num_prompt_tokens: int,
                         parse_calls: bool) -> AsyncIterator[Event]:
    """The reply's events; an error from the engine propagates after the events already made."""
    yield "message_start", {"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": _usage(num_prompt_tokens, 0, 0)}}
    yield "ping", {"type": "ping"}
    blocks = _Blocks()

    def finish(end: ReplyEnd) -> list[Event]:
        calls, last = end.calls, end.last
        stop_reason, stop_sequence = _stop(last.finish_reason if last else None, last.stop_reason if last else None,
                                           bool(calls))
        generated, cached = (last.num_generated_tokens, last.num_cached_tokens) if last else (0, 0)
        return blocks.close() + [e for call in calls for e in blocks.tool_use(call)] + [
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop_reason,
                                                                  "stop_sequence": stop_sequence},
                               "usage": _usage(num_prompt_tokens, generated, cached)})]
    async with aclosing(reply_events(deltas, parse_calls, lambda kind, text: blocks.write(
            "thinking" if kind == "thinking" else "text", text), finish)) as events:
        async for event in events:
            yield event
    yield "message_stop", {"type": "message_stop"}


async def message_body(events: AsyncIterator[Event]) -> dict:
    """The events folded into the whole message (the non-streamed reply)."""
    message, content, arguments = {}, [], {}
    async with aclosing(events):
        async for name, event in events:
            if name == "message_start":
                message = event["message"]
            elif name == "content_block_start":
                content.append(dict(event["content_block"]))
            elif name == "content_block_delta":
                block, delta = content[event["index"]], event["delta"]
                if delta["type"] == "input_json_delta":
                    arguments[event["index"]] = arguments.get(event["index"], "") + delta["partial_json"]
                else:
                    field = "text" if delta["type"] == "text_delta" else "thinking"
                    block[field] += delta[field]
            elif name == "content_block_stop" and event["index"] in arguments:
                content[event["index"]]["input"] = json.loads(arguments[event["index"]] or "{}")
            elif name == "message_delta":
                message.update(event["delta"])
                message["usage"] = event["usage"]
    return {**message, "content": content}


def sse(name: str, event: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()
