"""Paged attention on the CPU backend as one hand-written C kernel that reads the KV cache in place.

tinygrad's version (workers/attention.py) gathers the blocks into a dense copy, then runs the scores, softmax
and weighted sum as separate kernels over `nb` symbolic blocks; on this CPU those ran at ~1 GFLOP/s on one
core. This kernel walks the block table itself, up to each row's own length: per (row, kv head) the scores of
its query heads, a softmax with a vectorised exp, and the weighted sum of the values. A decode row is a
sequence (its own table row and length); a prefill row is one query of a chunk, causal from the chunk's start.
Rows are dealt to the cores round-robin through tinygrad's `core_id`. Like workers/cpu_matvec.py it is
portable C (clang vector extensions, workers/c/attention.c) run as a tinygrad PROGRAM (workers/c_kernel.py).
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.renderer import Estimates

from tinyvllm.workers.c_kernel import c_kernel, c_source


def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
    return head_dim % 16 == 0 and heads % kv_heads == 0


def _program(rows: int, heads: int, kv_heads: int, head_dim: int, block_size: int, max_blocks: int, prefill: bool):
    items = rows * kv_heads
    cores = max(1, min(NUM_CPU_THREADS.value, items))
    name = f"paged_attention_{'prefill' if prefill else 'decode'}_{rows}_{heads}_{kv_heads}_{head_dim}_{block_size}_{max_blocks}_c{cores}"
    source = c_source("attention.c", dict(B=rows, H=heads, KVH=kv_heads, D=head_dim, BS=block_size, MAXB=max_blocks,
                                          CORES=cores, PREFILL=int(prefill), SCALE=f"{float(head_dim) ** -0.5!r}f"))
    return c_kernel(name, source, cores, Estimates(ops=4 * rows * heads * head_dim))


def _attend(q: Tensor, cache: Tensor, tables: Tensor, lens: Tensor, block_size: int, prefill: bool) -> Tensor:
    rows, heads, head_dim = q.shape
    out = Tensor.empty(rows, heads * head_dim, dtype=dtypes.float32, device=q.device)
    fxn = _program(rows, heads, cache.shape[2], head_dim, block_size, tables.shape[-1], prefill)
    return out.custom_kernel(q.float().contiguous(), cache, tables.cast(dtypes.int32).contiguous(),
                             lens.cast(dtypes.int32).contiguous(), fxn=fxn)[0]


def cpu_decode_attention(q: Tensor, cache: Tensor, block_tables: Tensor, context_lens: Tensor, block_size: int) -> Tensor:
    """q [B, H, D]; cache [slots, 2, KVH, D] (workers/kv_cache.py); block_tables [B, max_blocks] int32;
    context_lens [B] int32 (row b attends to its first context_lens[b] positions) -> [B, H * D]."""
    return _attend(q, cache, block_tables, context_lens, block_size, prefill=False)


def cpu_prefill_attention(q: Tensor, cache: Tensor, block_table: Tensor, start: Tensor, block_size: int) -> Tensor:
    """One sequence's chunk: q [T, H, D] for positions start .. start+T-1 (causal); block_table [max_blocks]
    int32; start: an int32 Tensor of one element -> [T, H * D]."""
    return _attend(q, cache, block_table.reshape(1, -1), start.reshape(1), block_size, prefill=True)
