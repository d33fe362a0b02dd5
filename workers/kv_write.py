"""Writing a step's new keys and values into the paged cache: one kernel per layer, every token at once.

A token's slot is its block's id (looked up in its sequence's block table row) * block_size + its offset in the
block. The slots are computed once per step (`decode_slots`, `prefill_slots`), then each layer's `write_kv`
stores every token's [2, kv_heads, head_dim] row at its slot in place: a custom kernel with a gathered store,
which tinygrad's assign cannot express without one kernel per token (a decode step of 256 rows was 7,680
kernels). Padding rows of a decode batch and padding tokens of a prefill chunk write to the scratch block.
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.uop.ops import KernelInfo, UOp


def _store_rows(cache: UOp, kv: UOp, slots: UOp) -> UOp:
    t, c, h, d = (UOp.range(size, axis) for axis, size in enumerate(kv.shape))
    return cache[slots[t], c, h, d].store(kv[t, c, h, d]).end(t, c, h, d).sink(
        arg=KernelInfo(name=f"write_kv_{kv.shape[0]}"))


def write_kv(cache: Tensor, kv: Tensor, slots: Tensor) -> Tensor:
    """cache [num_slots, 2, KVH, D] with kv [T, 2, KVH, D] stored at slots [T] (int32): the cache after the write."""
    return cache.custom_kernel(kv.float().contiguous(), slots, fxn=_store_rows)[0]


def decode_slots(block_tables: Tensor, context_lens: Tensor, block_size: int) -> Tensor:
    """Row b's new token sits at position context_lens[b] - 1 of block table row b: [B] slots."""
    pos = context_lens.cast(dtypes.int32) - 1
    block = block_tables.gather(1, (pos // block_size).reshape(-1, 1)).reshape(-1)
    return (block * block_size + pos % block_size).contiguous()


def prefill_slots(block_table: Tensor, start: Tensor, n_valid: Tensor, T: int, block_size: int,
                  scratch_slot: int) -> Tensor:
    """A chunk of T tokens at positions start.. of which the first n_valid are real: [T] slots (the padding's:
    the scratch slot)."""
    t = Tensor.arange(T, dtype=dtypes.int32)
    pos = start.reshape(1) + t
    block_idx = (pos // block_size).clip(0, block_table.shape[0] - 1)  # padding may run past the table
    slots = block_table[block_idx] * block_size + pos % block_size
    return (t < n_valid.reshape(1)).where(slots, scratch_slot).cast(dtypes.int32).contiguous()
