"""The paged KV cache's bookkeeping: which fixed-size blocks are free, and who holds the rest.

The scheduler owns this; workers only ever see block ids. Blocks are ref-counted so that two
requests can later share one (prefix caching, parallel sampling) without changing the record:

- prefix caching: a full block gets `block_hash` (its tokens chained with its parent block's hash),
  a hash -> block map finds it; when its ref count drops to 0 it goes to the free queue but keeps
  its hash, so it can be revived until allocation evicts it from the queue's front (LRU, which is why
  free() returns a request's blocks tail first: a prompt's tail is the least likely part to be shared).
  Reviving needs removal from the middle of the free queue: replace the deque behind
  _take_free_block/_return_free_block with an ordered map then.
- copy-on-write: a write into a block whose ref_count > 1 first allocates a private copy.
"""
import itertools
from collections import Counter, deque
from dataclasses import dataclass

from scheduler.request import Request


@dataclass(slots=True)
class KVBlock:
    block_id: int
    ref_count: int = 0
    # Unused until prefix caching: set once the block is full, cleared when it is evicted.
    block_hash: int | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.block_size = block_size
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free_block_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_total_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_block_ids)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_blocks_to_allocate(self, req: Request, num_total_tokens: int) -> int:
        return max(0, self.blocks_for_tokens(num_total_tokens) - len(req.block_ids))

    def can_allocate(self, req: Request, num_total_tokens: int) -> bool:
        return self.num_blocks_to_allocate(req, num_total_tokens) <= self.num_free_blocks

    def allocate(self, req: Request, num_total_tokens: int) -> bool:
        """Grows req.block_ids to hold num_total_tokens slots. All or nothing: False leaves everything as it was."""
        needed = self.num_blocks_to_allocate(req, num_total_tokens)
        if needed > self.num_free_blocks:
            return False
        for _ in range(needed):
            block = self._take_free_block()
            block.ref_count = 1
            req.block_ids.append(block.block_id)
        return True

    def free(self, req: Request) -> None:
        """Drops req's hold on its blocks; those nobody else holds go back to the free queue, tail first."""
        for block_id in reversed(req.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._return_free_block(block)
        req.block_ids.clear()

    def _take_free_block(self) -> KVBlock:
        block = self.blocks[self._free_block_ids.popleft()]
        assert block.ref_count == 0, f"block {block.block_id} on the free queue with ref_count {block.ref_count}"
        return block

    def _return_free_block(self, block: KVBlock) -> None:
        self._free_block_ids.append(block.block_id)

    def check_invariants(self, holders: list[Request]) -> None:
        """Raises AssertionError unless the pool agrees with `holders`, which must be every request holding blocks."""
        for req in holders:
            assert len(set(req.block_ids)) == len(req.block_ids), f"{req.req_id} holds a block twice: {req.block_ids}"
        held = Counter(itertools.chain.from_iterable(req.block_ids for req in holders))
        free = set(self._free_block_ids)
        assert len(free) == len(self._free_block_ids), "a block is on the free queue twice"
        for block_id in free | set(held):
            assert 0 <= block_id < self.num_total_blocks, f"block id {block_id} out of range"
        for block in self.blocks:
            if block.block_id in free:
                assert block.ref_count == 0, f"free block {block.block_id} has ref_count {block.ref_count}"
                assert held[block.block_id] == 0, f"block {block.block_id} is free and held"
            else:
                assert block.ref_count > 0, f"block {block.block_id} is neither free nor held (leaked)"
                assert block.ref_count == held[block.block_id], (
                    f"block {block.block_id}: ref_count {block.ref_count} but {held[block.block_id]} holders")
        assert len(free) + len(held) == self.num_total_blocks, "free + held != total"
