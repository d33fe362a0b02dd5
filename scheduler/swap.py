"""CPU swap (--swap-space, vLLM V0's swap preemption): a preempted request's KV blocks are copied into host-memory swap
slots and copied back into fresh blocks when it resumes, instead of being recomputed.

The scheduler owns the slot accounting; every worker keeps its own shard of each slot (workers/host_swap.py). A plan
carries swap_out [block, slot] pairs and swap_in [slot, block] pairs; workers apply them in this order: swap out,
copy-on-write copies, swap in, then compute. A victim is never in a step in flight (preemption.py), and workers run
plans in order, so a swap-out reads the victim's blocks after every step that wrote them and before anything the
same or a later plan writes into them once they are free.

Swap or recompute: swapping costs two copies of each block over host memory (out, and back in); recomputing runs
the whole model over every computed token, which for any model is far more work per token than moving its keys
and values. Only a short request is cheaper to recompute: its few tokens ride along in a batched step, while
each block copy is a transfer of its own. So: swap when the request has computed at least swap_min_tokens and
the free slots hold all its computed blocks; else recompute. Requests that need every prompt position (prompt
logprobs, embeddings) keep worker state a resume would lose: they are always recomputed; so are requests that gave
blocks back behind a sliding window (a resume takes blocks for the whole length, more than such a request holds).

Every computed block is copied, shared ones too (prefix-cache hits, forks), and a resumed request takes fresh blocks
for all of them: a shared block costs a copy more, but no block is ever held by a request that is not running.
"""
from tinyvllm.scheduler.kv_cache_manager import KVCacheManager
from tinyvllm.scheduler.request import Request


class SwapSpace:
    def __init__(self, num_slots: int, min_tokens: int):
        self.num_slots, self.min_tokens = num_slots, min_tokens
        self._free: list[int] = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self._freed_this_plan: list[int] = []  # read by this plan's swap-ins: reusable from the next plan on
        self._swap_out: list[list[int]] = []  # [block, slot] for the plan being made
        self._swap_in: list[list[int]] = []  # [slot, block]
        self.num_swapped_out_blocks = self.num_swapped_in_blocks = 0  # cumulative

    @property
    def num_free_slots(self) -> int:
        return len(self._free) + len(self._freed_this_plan)

    def should_swap(self, req: Request, kv: KVCacheManager) -> bool:
        return (req.num_computed_tokens >= max(1, self.min_tokens) and not req.needs_every_position
                and not req.num_freed_blocks and kv.blocks_for_tokens(req.num_computed_tokens) <= len(self._free))

    def swap_out(self, req: Request, kv: KVCacheManager) -> None:
        """Copies the blocks holding req's computed tokens into free slots (the caller then frees the blocks)."""
        num_blocks = kv.blocks_for_tokens(req.num_computed_tokens)
        req.swap_slots = [self._free.pop() for _ in range(num_blocks)]
        self._swap_out += [[block, slot] for block, slot in zip(req.block_ids, req.swap_slots)]
        self.num_swapped_out_blocks += num_blocks

    def swap_in(self, req: Request) -> None:
        """req was just admitted with fresh blocks: its slots are copied into the first of them and given back."""
        self._swap_in += [[slot, block] for slot, block in zip(req.swap_slots, req.block_ids)]
        self.num_swapped_in_blocks += len(req.swap_slots)
        self._freed_this_plan += req.swap_slots
        req.swap_slots = []

    def release(self, req: Request) -> None:
        """req ended while swapped out (aborted, say): its slots are free again."""
        self._free += reversed(req.swap_slots)
        req.swap_slots = []

    def take_plan_lists(self) -> tuple[list[list[int]], list[list[int]]]:
        """(swap_out, swap_in) of the plan being made; slots its swap-ins read become free for the next plans."""
        lists = self._swap_out, self._swap_in
        self._swap_out, self._swap_in = [], []
        self._free += self._freed_this_plan
        self._freed_this_plan = []
        return lists
