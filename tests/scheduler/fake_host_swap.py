"""The fake worker's host swap space (workers/host_swap.py's stand-in): a slot holds a copy of one block's fake KV
slots, so a block swapped back wrong fails the fake worker's KV checks like any lost block."""
from dataclasses import dataclass, field


@dataclass
class FakeHostSwap:
    block_size: int
    num_blocks: int
    slots: dict[int, list] = field(default_factory=dict)
    num_swapped_out_blocks: int = 0
    num_swapped_in_blocks: int = 0

    def swap_out(self, kv: list, pairs: list[list[int]]) -> None:
        bs = self.block_size
        for block, slot in pairs:
            assert 0 <= block < self.num_blocks and slot >= 0, f"bad swap-out {block} -> slot {slot}"
            self.slots[slot] = kv[block * bs:(block + 1) * bs]
            self.num_swapped_out_blocks += 1

    def swap_in(self, kv: list, pairs: list[list[int]]) -> None:
        bs = self.block_size
        for slot, block in pairs:
            assert slot in self.slots and 0 <= block < self.num_blocks, f"bad swap-in slot {slot} -> {block}"
            kv[block * bs:(block + 1) * bs] = self.slots.pop(slot)
            self.num_swapped_in_blocks += 1
