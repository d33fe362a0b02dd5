"""Which routable instance takes a request: frontend/engine/replica_router.py's ReplicaRouter over the instances.

Each instance URL gets a ReplicaRouter index (a slot) the first time it is a candidate; an instance that comes back
under the same URL (a new Instance) keeps the slot, with its prefix memory cleared (it may have restarted with an
empty cache). Load is the ReplicaRouter's: waiting x 4 + running from the instance's last heartbeat or /metrics
scrape, with the router's own open requests on it that the report does not show yet counted as waiting. An
instance's prefix memory is the prompts routed to it by this router, and, with --tokenizer, the blocks its KV events
say it holds (kv_event_streams.py), whichever router routed them.
"""
from tinyvllm.frontend.engine.replica_router import CACHE_AWARE, ReplicaRouter, RoutingPolicy
from tinyvllm.frontend.router.instance_registry import Instance
from tinyvllm.protocol.messages import SchedulerStats

PREFIX_CHUNKS_PER_INSTANCE = 16384  # 1 MiB of prompt text remembered per instance
MAX_FOLLOWED_BLOCKS = 1 << 18  # ~34 MiB of hashes when full, for an instance whose KV events the router follows


class InstancePicker:
    def __init__(self, policy: RoutingPolicy = RoutingPolicy(), prefix_chunks: int = PREFIX_CHUNKS_PER_INSTANCE):
        self.router = ReplicaRouter(0, policy)
        self.prefix_chunks = prefix_chunks
        self._slots: dict[str, int] = {}  # url -> its index in the ReplicaRouter
        self._holders: list[Instance | None] = []  # by index: whose prefix memory it is (None: forgotten)

    @property
    def uses_prefixes(self) -> bool:
        """Whether the policy reads prompts' chunk hashes (least-loaded and round-robin do not: nothing to hash)."""
        return self.router.policy.mode == CACHE_AWARE

    def pick(self, candidates: list[Instance], hashes: list[bytes]) -> tuple[Instance, str] | None:
        """(instance, "cache" or "load"), or None without candidates."""
        if not candidates:
            return None
        by_slot = {self._slot(instance): instance for instance in candidates}
        stats = {slot: SchedulerStats(num_running=i.load.running, num_waiting=i.load.waiting)
                 for slot, i in by_slot.items()}
        slot, reason = self.router.decide(stats, hashes)
        return by_slot[slot], reason

    def follow(self, instance: Instance, num_blocks: int) -> None:
        """From now on the instance's KV events (kv_event_streams.py) say what it holds: its memory becomes as large as
        its KV pool (at most MAX_FOLLOWED_BLOCKS)."""
        self.router.prefixes[self._slot(instance)].reset(min(num_blocks, MAX_FOLLOWED_BLOCKS))

    def apply_events(self, instance: Instance, events: list) -> None:
        self.router.prefixes[self._slot(instance)].apply_events(events)

    def keep(self, urls: set[str]) -> None:
        """Forgets the prefixes of every instance not in `urls` (it left the registry): a fleet whose pods come and go
        under new addresses must not keep every departed one's memory."""
        for url, slot in self._slots.items():
            if url not in urls and self._holders[slot] is not None:
                self.router.prefixes[slot].reset(0)
                self._holders[slot] = None

    def known_blocks(self, url: str) -> int:
        """How many block (or chunk) hashes are remembered for the instance at `url`."""
        slot = self._slots.get(url)
        return 0 if slot is None else len(self.router.prefixes[slot])

    def opened(self, instance: Instance, hashes: list[bytes]) -> None:
        self.router.opened(self._slot(instance), hashes, 1)

    def closed(self, instance: Instance) -> None:
        self.router.closed(self._slot(instance), 1)

    def _slot(self, instance: Instance) -> int:
        slot = self._slots.get(instance.url)
        if slot is None:
            slot = self._slots[instance.url] = self.router.add_replica(self.prefix_chunks)
            self._holders.append(instance)
        elif self._holders[slot] is not instance:
            self.router.prefixes[slot].reset(self.prefix_chunks)
            self._holders[slot] = instance
        return slot
