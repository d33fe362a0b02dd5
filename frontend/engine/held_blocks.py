"""The blocks this server's engines hold in their prefix caches, as one set, for routers elsewhere to follow
(GET /kv_events, frontend/api/kv_event_routes.py): so every `tinyvllm router` replica learns where a prompt's blocks
are cached, not only the one that routed it.

Kept by the engines' own KV events (--kv-events-config; frontend/engine/kv_event_follower.py). Each engine's hashes
are kept apart and subscribers hear about their union, in the events' names and integer hashes: a hash is stored
when the first engine holds it, removed when the last one drops it. A subscriber first gets the whole set (after an
AllBlocksCleared), then the changes; one that falls MAX_QUEUED_BATCHES behind is dropped (it reconnects and starts
from a fresh set), so a slow router never holds the server's memory. An engine that fails holds nothing from then on
(EnginePool clears its set at once, and again when its replacement is ready).
"""
import asyncio
from collections import Counter

from tinyvllm.protocol.kv_events import read_wire_event

MAX_QUEUED_BATCHES = 4096


class Subscription:
    def __init__(self, first: dict):
        self._queue: asyncio.Queue[dict | None] = asyncio.Queue(MAX_QUEUED_BATCHES)
        self._queue.put_nowait(first)
        self.dropped = False

    def offer(self, batch: dict | None) -> bool:
        """Queues a batch (None: the end); False once the subscriber is too far behind."""
        try:
            self._queue.put_nowait(batch)
            return True
        except asyncio.QueueFull:
            self.dropped = True
            return False

    async def next(self, timeout_s: float) -> dict | None:
        """The next batch; None at the end or once dropped (after what was queued); TimeoutError after timeout_s of
        quiet."""
        if self.dropped and self._queue.empty():
            return None
        return await asyncio.wait_for(self._queue.get(), timeout_s)


class HeldBlocks:
    def __init__(self, engines: int):
        self._by_engine: list[set[int]] = [set() for _ in range(engines)]
        self._holders: Counter[int] = Counter()  # hash -> how many engines hold it
        self._subscribers: set[Subscription] = set()
        self.block_size = 0
        self.num_blocks = [0] * engines

    def __len__(self) -> int:
        return len(self._holders)

    def engine_ready(self, engine: int, block_size: int, num_blocks: int) -> None:
        """An engine (re)started: its cache is empty (its AllBlocksCleared may have gone out before the follower
        reconnected)."""
        self.block_size, self.num_blocks[engine] = block_size, num_blocks
        self.clear(engine)

    def clear(self, engine: int) -> None:
        """The engine holds nothing (it failed, or started afresh)."""
        self.apply(engine, [{"type": "AllBlocksCleared"}])

    def apply(self, engine: int, events: list) -> None:
        """One engine's events, as they come off the wire (protocol/kv_events.py); malformed ones change nothing."""
        stored, removed = [], []
        held = self._by_engine[engine]
        for event in events:
            kind, keys = read_wire_event(event)
            if kind == "AllBlocksCleared":
                keys, kind = list(held), "BlockRemoved"
            if kind == "BlockStored":
                for key in keys:
                    if key not in held:
                        held.add(key)
                        self._holders[key] += 1
                        if self._holders[key] == 1:
                            stored.append(key)
            elif kind == "BlockRemoved":
                for key in keys:
                    if key in held:
                        held.discard(key)
                        self._holders[key] -= 1
                        if not self._holders[key]:
                            del self._holders[key]
                            removed.append(key)
        changes = [*([{"type": "BlockRemoved", "block_hashes": removed}] if removed else []),
                   *([{"type": "BlockStored", "block_hashes": stored}] if stored else [])]
        if changes:
            self._publish({"events": changes})

    def subscribe(self) -> Subscription:
        """A subscription whose first batch is the whole set."""
        first = {"block_size": self.block_size, "num_blocks": sum(self.num_blocks),
                 "events": [{"type": "AllBlocksCleared"}, {"type": "BlockStored", "block_hashes": list(self._holders)}]}
        subscription = Subscription(first)
        self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscribers.discard(subscription)

    def close(self) -> None:
        for subscription in self._subscribers:
            subscription.offer(None)
        self._subscribers.clear()

    def _publish(self, batch: dict) -> None:
        for subscription in list(self._subscribers):
            if not subscription.offer(batch):
                self._subscribers.discard(subscription)
