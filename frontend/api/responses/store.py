"""The opt-in response store (`--responses-store-size N`): the last N responses by id, least recently used first out,
for `previous_response_id`, `GET`, `DELETE` and cancel. In memory and per server: a restart forgets it, and behind
`tinyvllm router` a follow-up must reach the instance that answered (docs/CLIENTS.md).

Each entry keeps the response as the client sees it and the conversation it ends, as Responses input items (this
input after the earlier turns', then this output's message and function calls), so a follow-up is that conversation
plus its own input. A background response (`background: true`) also keeps its events for `GET ?stream=true`, and its
task, so cancel can stop it; one still running is never evicted."""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api.responses.request import FunctionCallItem, MessageItem

RUNNING = ("queued", "in_progress")


@dataclass(eq=False)
class StoredResponse:
    response: dict  # the builder's, live while it runs
    items: list  # Responses input items: the conversation up to this response's; its output is added at the end
    task: asyncio.Task | None = None  # a background response's generation
    events: list[dict] | None = None  # a background response's events so far
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def running(self) -> bool:
        return self.response["status"] in RUNNING

    def add_event(self, event: dict) -> None:
        self.events.append(event)
        self.changed.set()

    def end(self) -> None:
        """The output becomes part of the conversation (reasoning stays out, as chat templates drop past thinking)."""
        for item in self.response["output"]:
            if item["type"] == "message":
                self.items.append(MessageItem(role="assistant", content=item["content"][0]["text"]))
            elif item["type"] == "function_call":
                self.items.append(FunctionCallItem(type="function_call", call_id=item["call_id"], name=item["name"],
                                                   arguments=item["arguments"]))
        self.changed.set()

    async def replay(self, after: int = -1) -> AsyncIterator[dict]:
        """A background response's events with sequence_number > after, then each new one until it ends."""
        while True:
            self.changed.clear()
            while after + 1 < len(self.events):
                after += 1
                yield self.events[after]
            if not self.running:
                return
            await self.changed.wait()


class ResponseStore:
    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str, param: str = "response_id") -> StoredResponse:
        if (entry := self._entries.get(response_id)) is None:
            raise api.APIError(f"Response with id '{response_id}' not found.", 404, "NotFoundError", param)
        self._entries.move_to_end(response_id)
        return entry

    def put(self, entry: StoredResponse) -> None:
        """Keeps the entry, evicting the least recently used finished ones past the size; a 503 when every entry
        is a background response still running."""
        while len(self._entries) >= self.size:
            oldest = next((k for k, e in self._entries.items() if not e.running), None)
            if oldest is None:
                raise api.APIError(f"All {self.size} places of the response store hold background responses still "
                                   "running; wait for one to end or cancel one", 503, "ServiceUnavailableError")
            del self._entries[oldest]
        self._entries[entry.response["id"]] = entry

    def pop(self, response_id: str) -> StoredResponse:
        entry = self.get(response_id)
        del self._entries[response_id]
        return entry
