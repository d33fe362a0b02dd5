"""This worker's shard of the CPU swap space (--swap-space; the scheduler's side is scheduler/swap.py): a slot holds
one block of every layer as KVBlockIO bytes, whatever the cache's layout or dtype. With tensor or pipeline
parallelism every worker swaps its own part of the same blocks under the same slot ids.

Slots live in a dict: a slot takes host memory from its swap-out until its swap-in, and the scheduler hands out at
most num_slots of them, so the whole never exceeds --swap-space. A request that ended while swapped out (an abort)
leaves its slots' bytes here until the scheduler hands them out again."""
from tinyvllm.workers.kv_block_io import KVBlockIO


class HostSwap:
    def __init__(self, block_io: KVBlockIO, swap_space_bytes: int):
        self.block_io = block_io
        self.num_slots = swap_space_bytes // block_io.nbytes
        self._slots: dict[int, bytes] = {}

    def check(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"swap slot {slot} is out of range (0..{self.num_slots - 1})")

    def swap_out(self, pairs: list[list[int]]) -> None:
        """[block, slot] pairs: each block's keys and values (every layer) into host memory."""
        for block, slot in pairs:
            self.check(slot)
            self._slots[slot] = self.block_io.read(block)

    def swap_in(self, pairs: list[list[int]]) -> None:
        """[slot, block] pairs: each slot back into a block; the slot's memory is given back."""
        for slot, block in pairs:
            self.check(slot)
            self.block_io.write(block, self._slots.pop(slot))
