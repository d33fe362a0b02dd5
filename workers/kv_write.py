"""Writing a step's new keys and values into the paged cache: one kernel per layer, every token at once.

A token's slot is its block's id (looked up in its sequence's block table row) * block_size + its offset in the
block. The slots are computed once per step (`token_slots`), then each layer's `write_kv`
stores every token's [2, kv_heads, head_dim] row at its slot in place: a custom kernel with a gathered store,
which tinygrad's assign cannot express without one kernel per token (a decode step of 256 rows was 7,680
kernels). The padding tokens of a step's bucket write to the scratch block. A float32, float16 or bfloat16 cache's
rows become its dtype (workers/kv_quant.py) inside the kernel; an int8 or fp8 cache's are quantised first (tinygrad
ops over the step's rows: their scales need each row's maximum), and the scales stored the same way.
"""
from __future__ import annotations

import functools

from tinygrad import Tensor, dtypes
from tinygrad.uop.ops import KernelInfo, UOp

from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.kv_quant import encode, is_quantized, quantize


def _store_rows(encoding: str | None, cache: UOp, rows: UOp, slots: UOp) -> UOp:
    t, *rest = (UOp.range(size, axis) for axis, size in enumerate(rows.shape))
    name = f"write_kv_{'_'.join(map(str, rows.shape))}_{cache.dtype.name}"
    row = rows[(t, *rest)]
    stored = encode(row, encoding) if encoding else row.cast(cache.dtype)
    return cache[(slots[t], *rest)].store(stored).end(t, *rest).sink(arg=KernelInfo(name=name))


def write_kv(cache: Tensor, rows: Tensor, slots: Tensor, encoding: str | None = None) -> Tensor:
    """cache [num_slots, ...] with rows [T, ...] stored at slots [T] (int32), converted to the cache's dtype inside
    the kernel (encoding: by workers/kv_quant.py's encode of that cache dtype, else a cast): the cache after the
    write."""
    return cache.custom_kernel(rows.contiguous(), slots, fxn=functools.partial(_store_rows, encoding))[0]


def write_layer(cache: PagedKVCache, layer: int, kv: Tensor, slots: Tensor) -> tuple[Tensor, Tensor | None]:
    """kv [T, 2, KVH, D] float32 into layer `layer` at slots [T]: (its values after the write, its scales after the
    write or None for an unquantised cache)."""
    if not is_quantized(cache.dtype):
        return write_kv(cache.layers[layer], kv, slots, cache.dtype), None
    codes, scales = quantize(kv, cache.dtype)
    return write_kv(cache.layers[layer], codes, slots), write_kv(cache.scales[layer], scales, slots)


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
