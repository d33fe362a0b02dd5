"""KV-cache events as vLLM publishes them (vllm/distributed/kv_events.py), for external KV-aware routers.

A ZMQ message is three frames: the topic, an 8-byte big-endian sequence number, and a msgpack EventBatch:
{"ts": seconds, "events": [...], "data_parallel_rank": r}, each event a map tagged by its "type":
- BlockStored: block_hashes (a chain, in order), parent_block_hash (the hash before the first; nil for a prompt's
  first block), token_ids (the blocks' tokens, block_size each), block_size, lora_id, medium, lora_name;
- BlockRemoved: block_hashes, medium;
- AllBlocksCleared: nothing else (the engine's cache is empty: it started, or restarted).
Hashes are integers, as vLLM sends them by default: the low 64 bits of our 128-bit block hash
(protocol/block_hash.py), unsigned. Fields whose value is vLLM's default (extra_keys, group_idx, ...) are left out, as
vLLM's msgspec structs (omit_defaults) leave them.
"""
from dataclasses import dataclass, field

from tinyvllm.protocol.block_hash import BlockHash

MEDIUM_DEVICE = "GPU"  # vLLM's name for the engine's own KV cache, whatever the device


def external_hash(block_hash: BlockHash) -> int:
    """A block hash as the events carry it (vLLM's integer form: the digest's low 64 bits, unsigned)."""
    return int.from_bytes(block_hash[-8:], "big")


@dataclass(slots=True)
class BlockStored:
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int

    def wire(self) -> dict:
        parent = self.parent_block_hash
        return {"type": "BlockStored", "block_hashes": [external_hash(h) for h in self.block_hashes],
                "parent_block_hash": None if parent is None else external_hash(parent),
                "token_ids": self.token_ids, "block_size": self.block_size, "lora_id": None,
                "medium": MEDIUM_DEVICE, "lora_name": None}


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list[BlockHash] = field(default_factory=list)

    def wire(self) -> dict:
        return {"type": "BlockRemoved", "block_hashes": [external_hash(h) for h in self.block_hashes],
                "medium": MEDIUM_DEVICE}


@dataclass(slots=True)
class AllBlocksCleared:
    def wire(self) -> dict:
        return {"type": "AllBlocksCleared"}


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def read_wire_event(event) -> tuple[str | None, list[int]]:
    """An event as a subscriber receives it (a map): its type and its integer block hashes, whatever else is wrong
    with it ((None, []) for anything but a map)."""
    if not isinstance(event, dict):
        return None, []
    keys = event.get("block_hashes")
    return event.get("type"), [k for k in keys if isinstance(k, int)] if isinstance(keys, list) else []


def event_batch(ts: float, events: list[KVEvent], data_parallel_rank: int) -> dict:
    return {"ts": ts, "events": [e.wire() for e in events], "data_parallel_rank": data_parallel_rank}


def record_stored(events: list[KVEvent], block_hash: BlockHash, parent: BlockHash | None, token_ids) -> None:
    """Appends a block's store to `events` (parent None: a prompt's first block), into the last event when it extends
    that one's chain (vLLM sends a request's blocks of one step as one BlockStored)."""
    last = events[-1] if events else None
    if isinstance(last, BlockStored) and last.block_hashes[-1] == parent:
        last.block_hashes.append(block_hash)
        last.token_ids.extend(token_ids)
    else:
        events.append(BlockStored([block_hash], parent, list(token_ids), len(token_ids)))  # a stored block is full


def record_removed(events: list[KVEvent], block_hash: BlockHash) -> None:
    last = events[-1] if events else None
    if isinstance(last, BlockRemoved):
        last.block_hashes.append(block_hash)
    else:
        events.append(BlockRemoved([block_hash]))
