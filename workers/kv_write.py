"""Writing a step's new keys and values into the paged cache: one kernel per layer, every token at once.

A token's slot is its block's id (looked up in its sequence's block table row) * block_size + its offset in the
block. The slots are computed once per step (`token_slots`), then each layer's `write_kv`
stores every token's [2, kv_heads, head_dim] row at its slot in place: a custom kernel with a gathered store,
which tinygrad's assign cannot express without one kernel per token (a decode step of 256 rows was 7,680
kernels). The padding tokens of a step's bucket write to the scratch block.
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


def token_slots(tables: Tensor, token_rows: Tensor, positions: Tensor, n_valid: Tensor, block_size: int,
                scratch_slot: int) -> Tensor:
    """Token t of a flat batch sits at position positions[t] of the sequence whose block table is row token_rows[t]
    of tables; the first n_valid tokens are real: [T] slots (the padding's: the scratch slot)."""
    T = positions.shape[0]
    pos = positions.cast(dtypes.int32)
    block_idx = (pos // block_size).clip(0, tables.shape[1] - 1)
    blocks = tables.flatten()[token_rows.cast(dtypes.int32) * tables.shape[1] + block_idx]
    valid = Tensor.arange(T, dtype=dtypes.int32) < n_valid.reshape(1)
    return valid.where(blocks * block_size + pos % block_size, scratch_slot).cast(dtypes.int32).contiguous()
