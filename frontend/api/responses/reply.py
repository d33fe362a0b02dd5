"""A Responses reply, made from the chat path's TextDeltas (thinking apart: frontend/api/reasoning.py): output items
(a reasoning item, a message with one output_text part, function_call items) and, streamed, the events that build
them, each with its sequence_number: response.created, response.in_progress, then per item
response.output_item.added, its deltas (response.reasoning_text.delta, response.content_part.added +
response.output_text.delta, response.function_call_arguments.delta), their .done events and
response.output_item.done, and response.completed (its status "incomplete" at max_output_tokens). The whole reply is
the same builder's last snapshot, so both come from one piece of code."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from tinyvllm.frontend.api.reply_parts import reply_events

Event = dict


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """The response so far; each method returns the events that tell a client what changed."""

    def __init__(self, request_echo: dict, num_prompt_tokens: int, count_tokens: Callable[[str], int]):
        self.response = {"id": _id("resp"), "object": "response", "created_at": int(time.time()), "status":
                         "in_progress", "error": None, "incomplete_details": None, "output": [], "usage": None,
                         **request_echo}
        self.sequence, self.open, self.p, self.count_tokens = 0, None, num_prompt_tokens, count_tokens

    def _event(self, type_: str, **fields) -> Event:
        self.sequence += 1
        return {"type": type_, "sequence_number": self.sequence - 1, **fields}

    def _snapshot(self) -> dict:
        return json.loads(json.dumps(self.response))  # (events must not change as the response grows)

    def start(self) -> list[Event]:
        created = self._event("response.created", response=self._snapshot())  # (a background one: queued)
        self.response["status"] = "in_progress"
        return [created, self._event("response.in_progress", response=self._snapshot())]

    def _add(self, item: dict) -> list[Event]:
        self.response["output"].append(item)
        return [self._event("response.output_item.added", output_index=len(self.response["output"]) - 1,
                            item=json.loads(json.dumps(item)))]

    def write(self, kind: str, text: str) -> list[Event]:
        """kind: "reasoning" or "message"."""
        events = []
        if self.open != kind:
            events += self.close()
            if kind == "reasoning":
                events += self._add({"type": "reasoning", "id": _id("rs"), "summary": [],
                                     "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"})
            else:
                events += self._add({"type": "message", "id": _id("msg"), "role": "assistant", "status": "in_progress",
                                     "content": []})
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                self.response["output"][-1]["content"].append(part)
                events.append(self._event("response.content_part.added", **self._where(), part=dict(part)))
            self.open = kind
        item = self.response["output"][-1]
        item["content"][0]["text"] += text
        delta_type = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return events + [self._event(delta_type, **self._where(), delta=text, **extra)]

    def _where(self) -> dict:
        index = len(self.response["output"]) - 1
        return {"item_id": self.response["output"][index]["id"], "output_index": index, "content_index": 0}

    def close(self) -> list[Event]:
        if self.open is None:
            return []
        item, where = self.response["output"][-1], self._where()
        item["status"] = "completed"
        text = item["content"][0]["text"]
        if self.open == "reasoning":
            events = [self._event("response.reasoning_text.done", **where, text=text)]
        else:
            events = [self._event("response.output_text.done", **where, text=text, logprobs=[]),
                      self._event("response.content_part.done", **where, part=dict(item["content"][0]))]
        self.open = None
        return events + [self._event("response.output_item.done", output_index=where["output_index"],
                                     item=json.loads(json.dumps(item)))]

    def function_call(self, call) -> list[Event]:
        item = {"type": "function_call", "id": _id("fc"), "call_id": call.id, "name": call.name, "arguments": "",
                "status": "in_progress"}
        events = self._add(item)
        where = {"item_id": item["id"], "output_index": len(self.response["output"]) - 1}
        item["arguments"], item["status"] = call.arguments, "completed"
        return events + [self._event("response.function_call_arguments.delta", **where, delta=call.arguments),
                         self._event("response.function_call_arguments.done", **where, arguments=call.arguments,
                                     name=call.name),
                         self._event("response.output_item.done", output_index=where["output_index"],
                                     item=dict(item))]

    def finish(self, last) -> list[Event]:
        incomplete = last is not None and last.finish_reason == "length"
        generated, cached = (last.num_generated_tokens, last.num_cached_tokens) if last is not None else (0, 0)
        thought = "".join(i["content"][0]["text"] for i in self.response["output"] if i["type"] == "reasoning")
        self.response.update(
            status="incomplete" if incomplete else "completed",
            incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
            usage={"input_tokens": self.p, "input_tokens_details": {"cached_tokens": cached},
                   "output_tokens": generated,
                   # the thinking's tokens, counted again from its text (the engine does not tell them apart)
                   "output_tokens_details": {"reasoning_tokens": self.count_tokens(thought) if thought else 0},
                   "total_tokens": self.p + generated})
        # response.completed also when the status is incomplete, as vLLM sends it: the SDKs' stream helpers wait for it
        return [self._event("response.completed", response=self._snapshot())]


async def response_events(deltas: AsyncIterator, builder: ResponseBuilder, parse_calls: bool) -> AsyncIterator[Event]:
    for event in builder.start():
        yield event
    def write(kind: str, text: str) -> list[Event]:
        return builder.write("reasoning" if kind == "thinking" else "message", text)

    def finish(end) -> list[Event]:
        return builder.close() + [e for call in end.calls for e in builder.function_call(call)] + builder.finish(end.last)
    async with aclosing(reply_events(deltas, parse_calls, write, finish)) as events:
        async for event in events:
            yield event


def sse(event: Event) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()
