"""Which data-parallel replica serves a request: the least loaded, unless one holds the prompt's prefix in its cache.

Load is vLLM's score, waiting x 4 + running, from each replica's latest scheduler stats. Those lag behind (a step, or
longer on a loaded machine), so requests routed since (open here, absent from the stats) are counted too: as running
where the replica had no queue, as waiting behind one. Counting them all as waiting made a replica whose stats were
a moment late look four times as loaded as one whose stats were current, and split 4 requests 3 to 1. Cache-aware as SGLang's router: each
replica's prompts are remembered as the chained hashes of their full blocks (the scheduler's own prefix-cache
keys), in an LRU as large as that replica's KV pool, so it forgets about as fast as the cache does; with KV events on,
each replica's index also follows what its engine stores and evicts (frontend/engine/kv_event_follower.py). A request goes
to the replica with the longest remembered prefix (at least one block) unless that replica is overloaded against
the least loaded one: its load exceeds the least by more than `balance_abs` and by more than `balance_rel` times.
Ties go round-robin, so that idle replicas take turns. The policy's `mode` can leave out the prefixes (LEAST_LOADED)
or the load as well (ROUND_ROBIN: candidates in turn), the baselines `tinyvllm router --routing-policy` compares with.
"""
from collections import OrderedDict
from dataclasses import dataclass

from tinyvllm.protocol.messages import SchedulerStats
from tinyvllm.protocol.block_hash import BlockHash, hash_block, root_hash
from tinyvllm.protocol.kv_events import external_hash, read_wire_event

WAITING_WEIGHT = 4  # vLLM's DP load balancer: a waiting request weighs as four running ones
CACHE, LOAD, TURN = "cache", "load", "turn"  # why decide() chose a replica
CACHE_AWARE, LEAST_LOADED, ROUND_ROBIN = "cache-aware", "least-loaded", "round-robin"
ROUTING_MODES = (CACHE_AWARE, LEAST_LOADED, ROUND_ROBIN)


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    balance_abs: int = 32  # load points (SGLang's --balance-abs-threshold is 32 requests)
    balance_rel: float = 1.5  # SGLang's --balance-rel-threshold
    mode: str = CACHE_AWARE  # one of ROUTING_MODES


def prompt_block_hashes(token_ids: list[int], block_size: int) -> list[BlockHash]:
    """The chained hash of every full block of the prompt, as the scheduler keys its prefix cache."""
    hashes, parent = [], root_hash(None)
    for end in range(block_size, len(token_ids) + 1, block_size):
        parent = hash_block(parent, token_ids[end - block_size:end])
        hashes.append(parent)
    return hashes


class PrefixIndex:
    """The block hashes one replica holds as far as the router knows, least recently used first, at most `capacity`
    of them: those of the prompts routed there and, where its engine publishes KV events (--kv-events-config), the
    blocks it stored, less those it evicted (apply). Kept in the events' integer form."""

    def __init__(self, capacity: int = 0):
        self.capacity = capacity
        self._hashes: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hashes)

    def add(self, hashes: list[BlockHash]) -> None:
        self._add([external_hash(h) for h in hashes])

    def _add(self, keys: list[int]) -> None:
        for key in keys:
            self._hashes[key] = None
            self._hashes.move_to_end(key)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)

    def apply_events(self, events: list) -> None:
        for event in events:
            self.apply(event)

    def apply(self, event: object) -> None:
        """One KV event as it comes off the wire (protocol/kv_events.py); a malformed one changes nothing."""
        kind, keys = read_wire_event(event)
        if kind == "BlockStored":
            self._add(keys)
        elif kind == "BlockRemoved":
            for key in keys:
                self._hashes.pop(key, None)
        elif kind == "AllBlocksCleared":
            self._hashes.clear()

    def matched_blocks(self, hashes: list[BlockHash]) -> int:
        """How many leading blocks of a prompt are here."""
        return self.matched_keys([external_hash(h) for h in hashes])

    def matched_keys(self, keys: list[int]) -> int:
        """matched_blocks for hashes already in the events' integer form."""
        for i, key in enumerate(keys):
            if key not in self._hashes:
                return i
        return len(keys)

    def reset(self, capacity: int) -> None:
        """A restarted replica's cache is empty."""
        self.capacity = capacity
        self._hashes.clear()


class ReplicaRouter:
    def __init__(self, size: int, policy: RoutingPolicy = RoutingPolicy()):
        self.policy = policy
        self.open_sequences = [0] * size  # routed here and not finished, as sequences (n per request)
        self.prefixes = [PrefixIndex() for _ in range(size)]
        self._next = 0  # where the round-robin among equals starts

    def load(self, replica: int, stats: SchedulerStats) -> int:
        unseen = max(0, self.open_sequences[replica] - stats.num_running - stats.num_waiting)
        unseen_weight = WAITING_WEIGHT if stats.num_waiting else 1
        return WAITING_WEIGHT * stats.num_waiting + stats.num_running + unseen_weight * unseen

    def add_replica(self, prefix_capacity: int = 0) -> int:
        """A new replica's index (`tinyvllm router` gains instances while it runs)."""
        self.open_sequences.append(0)
        self.prefixes.append(PrefixIndex(prefix_capacity))
        return len(self.open_sequences) - 1

    def choose(self, stats: dict[int, SchedulerStats], hashes: list[BlockHash]) -> int:
        """The replica (a key of `stats`: those that serve now) for a prompt with these block hashes."""
        return self.decide(stats, hashes)[0]

    def decide(self, stats: dict[int, SchedulerStats], hashes: list[BlockHash]) -> tuple[int, str]:
        """choose(), and why: CACHE when the remembered prefix decided, TURN under ROUND_ROBIN, LOAD otherwise."""
        order = sorted(stats, key=lambda r: (r - self._next) % len(self.open_sequences))
        if self.policy.mode == ROUND_ROBIN:
            self._next = (order[0] + 1) % len(self.open_sequences)
            return order[0], TURN
        loads = {r: self.load(r, stats[r]) for r in order}
        least = min(order, key=loads.__getitem__)
        choice, reason = least, LOAD
        if hashes and self.policy.mode == CACHE_AWARE:
            keys = [external_hash(h) for h in hashes]
            matched = {r: self.prefixes[r].matched_keys(keys) for r in order}
            best = max(matched.values())
            cached = min((r for r in order if matched[r] == best), key=loads.__getitem__)
            if best > 0 and not self._overloaded(loads[cached], loads[least]):
                choice, reason = cached, CACHE
        self._next = (choice + 1) % len(self.open_sequences)
        return choice, reason

    def _overloaded(self, load: int, least: int) -> bool:
        return load - least > self.policy.balance_abs and load > least * self.policy.balance_rel

    def opened(self, replica: int, hashes: list[BlockHash], sequences: int) -> None:
        self.open_sequences[replica] += sequences
        self.prefixes[replica].add(hashes)

    def closed(self, replica: int, sequences: int) -> None:
        self.open_sequences[replica] -= sequences
