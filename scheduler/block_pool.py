"""The physical KV blocks: ref counts, the free queue in eviction order, and the prefix-cache map.

A block nobody holds sits in the free queue. If it was registered in the prefix cache it keeps its hash
there ("cached free"): a later request with the same prefix revives it (taken out of the middle of the
queue in O(1)), and only when a fresh block is needed and it reaches the queue's front is it evicted.
Blocks join the queue's tail as their last holder lets go, so the front is the least recently used.
With `events` a list (KV events on: scheduler/kv_events.py), every registration and eviction is recorded there, in
order, for the publisher to take.
"""
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from tinyvllm.protocol.block_hash import BlockHash
from tinyvllm.protocol.kv_events import KVEvent, record_removed, record_stored


@dataclass(slots=True, eq=False)
class KVBlock:
    block_id: int
    ref_count: int = 0
    # Set once the block is full and its tokens computed; cleared when the block is evicted for reuse.
    block_hash: BlockHash | None = None
    # Checked on every cache hit, so that a hash collision can never hand out another prefix's keys/values.
    parent_hash: BlockHash | None = None
    token_ids: tuple[int, ...] = ()


class BlockPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"need num_blocks >= 1, got {num_blocks}")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # front: evicted first
        self._cached: dict[BlockHash, KVBlock] = {}
        self._num_cached_free = 0  # free blocks with a hash: kept as a count, since stats read it every step
        self.events: list[KVEvent] | None = None

    @property
    def num_total_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds, cached or not: all can be handed out."""
        return len(self._free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold prefix-cache content (a hit revives them; a fresh block evicts them)."""
        return self._num_cached_free

    def take_fresh(self, num_blocks: int) -> list[int]:
        """Hands out num_blocks blocks from the queue's front, evicting their cached contents, each with ref_count 1."""
        if num_blocks > len(self._free):
            raise ValueError(f"asked for {num_blocks} blocks, {len(self._free)} free")
        block_ids = []
        for _ in range(num_blocks):
            block = self.blocks[self._free.popitem(last=False)[0]]
            assert block.ref_count == 0, f"block {block.block_id} on the free queue with ref_count {block.ref_count}"
            self._num_cached_free -= block.block_hash is not None
            self._evict(block)
            block.ref_count = 1
            block_ids.append(block.block_id)
        return block_ids

    def hold(self, block_ids: Iterable[int]) -> None:
        """One more holder for each block; a cached free block is revived (leaves the free queue)."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
                self._num_cached_free -= block.block_hash is not None
            block.ref_count += 1

    def release(self, block_ids: Iterable[int]) -> None:
        """One holder fewer for each block; those nobody holds join the free queue in the order given."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"block {block_id} released more often than held"
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                self._num_cached_free += block.block_hash is not None

    def lookup(self, block_hash: BlockHash, parent_hash: BlockHash, token_ids: tuple[int, ...]) -> int | None:
        """The cached block with exactly this content, or None."""
        block = self._cached.get(block_hash)
        if block is None or block.parent_hash != parent_hash or block.token_ids != token_ids:
            return None
        return block.block_id

    def register(self, block_id: int, block_hash: BlockHash, parent_hash: BlockHash, token_ids: tuple[int, ...],
                 first: bool = False) -> bool:
        """Makes a full, computed block findable; False if it was not. A block already cached, or content already
        cached elsewhere (two requests computed the same prefix at once), stays as it is: one copy is enough.
        first: it is a prompt's first block (its parent is a root, which KV events do not name)."""
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self._cached:
            return False
        block.block_hash, block.parent_hash, block.token_ids = block_hash, parent_hash, token_ids
        self._cached[block_hash] = block
        self._num_cached_free += block.ref_count == 0
        if self.events is not None:
            record_stored(self.events, block_hash, None if first else parent_hash, token_ids)
        return True

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            if self.events is not None:
                record_removed(self.events, block.block_hash)
            block.block_hash, block.parent_hash, block.token_ids = None, None, ()
