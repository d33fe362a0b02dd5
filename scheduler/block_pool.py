"""The physical KV blocks: ref counts, the free queue in eviction order, and the prefix-cache map.

A block nobody holds sits in the free queue. If it was registered in the prefix cache it keeps its hash
there ("cached free"): a later request with the same prefix revives it (taken out of the middle of the
queue in O(1)), and only when a fresh block is needed and it reaches the queue's front is it evicted.
Blocks join the queue's tail as their last holder lets go, so the front is the least recently used.
"""
import itertools
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from tinyvllm.scheduler.block_hash import BlockHash


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

    @property
    def num_total_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds, cached or not: all can be handed out."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold prefix-cache content (a hit revives them; a fresh block evicts them)."""
        return self._num_cached_free

    def free_block_ids(self) -> list[int]:
        """The free queue, front (next to be evicted) first."""
        return list(self._free)

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

    def register(self, block_id: int, block_hash: BlockHash, parent_hash: BlockHash, token_ids: tuple[int, ...]) -> bool:
        """Makes a full, computed block findable; False if it was not. A block already cached, or content already
        cached elsewhere (two requests computed the same prefix at once), stays as it is: one copy is enough."""
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self._cached:
            return False
        block.block_hash, block.parent_hash, block.token_ids = block_hash, parent_hash, token_ids
        self._cached[block_hash] = block
        self._num_cached_free += block.ref_count == 0
        return True

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            block.block_hash, block.parent_hash, block.token_ids = None, None, ()

    def check_invariants(self, block_tables: Iterable[list[int]]) -> None:
        """Raises AssertionError unless ref counts equal the number of tables holding each block (every holder's
        table must be given), the free queue holds exactly the unheld blocks, and the cache map is consistent."""
        tables = list(block_tables)
        for table in tables:
            assert len(set(table)) == len(table), f"a block table holds a block twice: {table}"
        held = Counter(itertools.chain.from_iterable(tables))
        for block_id in held:
            assert 0 <= block_id < self.num_total_blocks, f"block id {block_id} out of range"
        for block in self.blocks:
            if block.block_id in self._free:
                assert block.ref_count == 0, f"free block {block.block_id} has ref_count {block.ref_count}"
                assert held[block.block_id] == 0, f"block {block.block_id} is free and held"
            else:
                assert block.ref_count > 0, f"block {block.block_id} is neither free nor held (leaked)"
                assert block.ref_count == held[block.block_id], (
                    f"block {block.block_id}: ref_count {block.ref_count} but {held[block.block_id]} holders")
            if block.block_hash is not None:
                assert self._cached.get(block.block_hash) is block, f"block {block.block_id}'s hash is not mapped to it"
        for block_hash, block in self._cached.items():
            assert block.block_hash == block_hash, f"cache map entry points at block {block.block_id} with another hash"
        assert len(self._free) + len(held) == self.num_total_blocks, "free + held != total"
        assert self._num_cached_free == sum(self.blocks[i].block_hash is not None for i in self._free), \
            "the count of cached free blocks drifted"
