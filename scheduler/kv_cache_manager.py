"""Per-request KV block bookkeeping over the BlockPool: block tables, prefix-cache hits, copy-on-write.

The scheduler owns this; workers only ever see block ids (and the block copies of a step).

- Prefix caching: a request's full, computed blocks are registered under their chained hashes; a request
  being admitted (new or resumed after preemption) takes the longest run of cached blocks matching its
  tokens and starts computing after them. The hit stops before the last token so the worker still
  computes a position and produces logits.
- Sliding windows (every layer of the model attends to the last `window` positions only): blocks wholly behind a
  request's window go back to the pool as it advances; their table entries become FREED (workers never read them).
- Copy-on-write: blocks can be shared (cache hits, parallel-sampling forks). Before a request writes
  into a block someone else also holds, it gets a private copy: the copy (src, dst) goes into the next
  StepPlan and the worker performs it before computing the step.
"""
from tinyvllm.protocol.block_hash import BlockHash, HashFn, hash_block, root_hash
from tinyvllm.scheduler.block_pool import BlockPool
from tinyvllm.scheduler.request import Request

FREED = -1  # a block table entry whose block went back to the pool: it lies wholly behind a sliding window


def held_blocks(req: Request) -> list[int]:
    """The blocks req holds: its table without the FREED entries (a prefix of it)."""
    return req.block_ids[req.num_freed_blocks:]


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True, hash_fn: HashFn = hash_block):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks)
        self._hash_fn = hash_fn
        self._block_copies: list[list[int]] = []  # [src, dst] pairs for the step being planned
        # (block id, hash) of each block that entered the prefix cache, while someone takes them (scheduler/disk_kv.py)
        self.newly_cached: list[tuple[int, BlockHash]] | None = None

    @property
    def num_total_blocks(self) -> int:
        return self.pool.num_total_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache --------------------------------------------------------------------------------

    def find_cached_prefix(self, req: Request) -> list[int]:
        """Block ids of the longest run of cached blocks that starts req's tokens, leaving its last token uncached."""
        if not self.enable_caching or req.needs_every_position:
            return []
        num_blocks = (req.num_tokens - 1) // self.block_size
        self._hash_full_blocks(req, num_blocks)
        hits: list[int] = []
        for i in range(num_blocks):
            block_id = self.pool.lookup(req.block_hashes[i], self.parent_hash(req, i), self.block_tokens(req, i))
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def cache_computed_blocks(self, req: Request) -> None:
        """Registers req's blocks that became full and computed since the last call."""
        num_full = req.num_computed_tokens // self.block_size
        if not self.enable_caching or num_full <= req.num_registered_blocks:
            return
        self._hash_full_blocks(req, num_full)
        for i in range(req.num_registered_blocks, num_full):
            if self.pool.register(req.block_ids[i], req.block_hashes[i], self.parent_hash(req, i),
                                  self.block_tokens(req, i), first=i == 0) and self.newly_cached is not None:
                self.newly_cached.append((req.block_ids[i], req.block_hashes[i]))
        req.num_registered_blocks = num_full

    def _hash_full_blocks(self, req: Request, num_blocks: int) -> None:
        """Extends req.block_hashes to its first num_blocks blocks (a request's tokens never change, only grow)."""
        hashes = req.block_hashes
        for i in range(len(hashes), num_blocks):
            hashes.append(self._hash_fn(self.parent_hash(req, i), self.block_tokens(req, i)))

    def parent_hash(self, req: Request, i: int) -> BlockHash:
        return req.block_hashes[i - 1] if i else root_hash(req.cache_salt)

    def block_tokens(self, req: Request, i: int) -> tuple[int, ...]:
        return tuple(req.token_ids_between(i * self.block_size, (i + 1) * self.block_size))

    # ---- allocation ----------------------------------------------------------------------------------

    def admit(self, req: Request, cached_block_ids: list[int], num_total_tokens: int) -> bool:
        """Gives a request that holds nothing the cached blocks plus fresh ones for num_total_tokens slots; leading
        FREED entries (a hit behind a sliding window: see behind_window) are not held. All or nothing: False leaves
        everything as it was."""
        assert not req.block_ids, f"{req.req_id} is admitted while holding blocks"
        num_freed = next((i for i, block_id in enumerate(cached_block_ids) if block_id != FREED), len(cached_block_ids))
        held = cached_block_ids[num_freed:]
        num_revived = sum(1 for block_id in held if self.pool.blocks[block_id].ref_count == 0)
        num_fresh = max(0, self.blocks_for_tokens(num_total_tokens) - len(cached_block_ids))
        if num_revived + num_fresh > self.num_free_blocks:
            return False
        self.pool.hold(held)  # before take_fresh, which could otherwise evict them
        req.block_ids = list(cached_block_ids) + self.pool.take_fresh(num_fresh)
        req.num_registered_blocks, req.num_freed_blocks = len(cached_block_ids), num_freed
        return True

    def behind_window(self, cached_block_ids: list[int], window: int) -> list[int]:
        """A hit for a request that starts after it, as admit takes it: the blocks wholly behind the window of its
        first new token become FREED (a hit may be longer than the whole cache)."""
        num_behind = max(0, (len(cached_block_ids) * self.block_size - window + 1) // self.block_size)
        return [FREED] * num_behind + cached_block_ids[num_behind:]

    def shared_blocks_to_write(self, req: Request) -> list[int]:
        """Indices into req.block_ids of blocks req will write into (from num_computed_tokens on) that others hold too."""
        blocks, table = self.pool.blocks, req.block_ids
        return [i for i in range(req.num_computed_tokens // self.block_size, len(table)) if blocks[table[i]].ref_count > 1]

    def allocate_slots(self, req: Request, num_total_tokens: int, may_copy: bool = True) -> bool:
        """Makes req's block table hold num_total_tokens slots, privately wherever req will write.
        All or nothing: False leaves everything as it was. may_copy=False: req's table must need no copy."""
        to_copy = self.shared_blocks_to_write(req)
        assert may_copy or not to_copy, f"{req.req_id} would write into blocks shared with others: {to_copy}"
        num_fresh = max(0, self.blocks_for_tokens(num_total_tokens) - len(req.block_ids))
        if len(to_copy) + num_fresh > self.num_free_blocks:
            return False
        for i in to_copy:
            src = req.block_ids[i]
            (dst,) = self.pool.take_fresh(1)
            self.pool.release([src])  # still held by the others: ref_count stays >= 1
            req.block_ids[i] = dst
            self._block_copies.append([src, dst])
        if num_fresh:
            req.block_ids += self.pool.take_fresh(num_fresh)
        return True

    def fork(self, parent: Request, child: Request) -> None:
        """child shares every block of parent (it has the same tokens); copy-on-write separates them later."""
        assert not child.block_ids, f"{child.req_id} forks while holding blocks"
        child.block_ids = list(parent.block_ids)
        child.num_freed_blocks = parent.num_freed_blocks
        self.pool.hold(held_blocks(child))
        child.block_hashes = list(parent.block_hashes)
        child.num_registered_blocks = parent.num_registered_blocks

    def free(self, req: Request) -> None:
        """Drops req's hold on its blocks. Its tail goes first into the free queue, so it is evicted first:
        the tail of a sequence is the part least likely to be shared."""
        self.pool.release(reversed(held_blocks(req)))
        req.block_ids = []
        req.num_registered_blocks = req.num_freed_blocks = 0

    def free_behind_window(self, req: Request, window: int) -> None:
        """Gives back req's blocks that none of its next tokens can see: those wholly before the last `window`
        positions of the next one (full and computed, so in the prefix cache already, where they stay until
        evicted). A step in flight may still read them: a block is only written again in a later plan, after it."""
        num_behind = max(0, (req.num_computed_tokens - window + 1) // self.block_size)
        if num_behind <= req.num_freed_blocks:
            return
        table = req.block_ids
        assert not self.enable_caching or num_behind <= req.num_registered_blocks, f"{req.req_id}: unregistered"
        self.pool.release(table[req.num_freed_blocks:num_behind])
        table[req.num_freed_blocks:num_behind] = [FREED] * (num_behind - req.num_freed_blocks)
        req.num_freed_blocks = num_behind

    def take_block_copies(self) -> list[list[int]]:
        """The step's copies, in order. A copy whose destination was freed again meanwhile is dropped."""
        copies = [pair for pair in self._block_copies if self.pool.blocks[pair[1]].ref_count > 0]
        self._block_copies = []
        return copies
