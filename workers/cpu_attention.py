"""Paged attention on the CPU backend as one hand-written C kernel that reads the KV cache in place.

tinygrad's version (workers/attention.py) gathers the blocks into a dense copy, then runs the scores, softmax
and weighted sum as separate kernels over `nb` symbolic blocks; on this CPU those ran at ~1 GFLOP/s on one
core. This kernel walks the block table itself, up to each row's own length, flash-style: a tile of up to 8
consecutive rows of one sequence (a prompt chunk's; a decode is a tile of one) and one kv head reads each key and
value once for all its queries, 16 keys at a time, with an online softmax (workers/c/attention.c). A row is one
token of a flat batch (workers/attention.py): its sequence's table row and its position, so decodes and prompt
chunks are alike. (tile, kv head) items are dealt to the cores round-robin through tinygrad's `core_id`. Like workers/cpu_matvec.py it is
portable C (clang vector extensions, workers/c/attention.c) run as a tinygrad PROGRAM (workers/c_kernel.py).
It reads every KV cache dtype in place (workers/c/kv_formats.h), scaling int8/fp8 codes by their per-token scales.
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.renderer import Estimates

from tinyvllm.workers.attention_spec import AttentionSpec
from tinyvllm.workers.c_kernel import c_kernel, c_source
from tinyvllm.workers.kv_quant import is_quantized


def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
    return head_dim % 16 == 0 and heads % kv_heads == 0


KV_FORMATS = {"float32": 0, "float16": 1, "bfloat16": 2, "int8": 3, "fp8": 4}  # workers/c/kv_formats.h


def _program(tokens: int, heads: int, kv_heads: int, head_dim: int, block_size: int, max_blocks: int, dtype: str,
             spec: AttentionSpec, sinks: bool):
    cores = max(1, min(NUM_CPU_THREADS.value, tokens * kv_heads))
    variant = f"_w{spec.window}_cap{spec.softcap:g}_s{spec.scale:.9g}" if spec != AttentionSpec.plain(head_dim) else ""
    variant += "_sinks" if sinks else ""
    name = f"paged_attention_{tokens}_{heads}_{kv_heads}_{head_dim}_{block_size}_{max_blocks}_{dtype}_c{cores}{variant}"
    source = c_source("attention.c", dict(T=tokens, H=heads, KVH=kv_heads, D=head_dim, BS=block_size, MAXB=max_blocks,
                                          CORES=cores, SCALE=f"{float(spec.scale)!r}f", WINDOW=spec.window,
                                          SOFTCAP=f"{float(spec.softcap)!r}f", KV_FORMAT=KV_FORMATS[dtype],
                                          QUANTIZED=int(is_quantized(dtype)), **({"SINKS": 1} if sinks else {})))
    return c_kernel(name, source, cores, Estimates(ops=4 * tokens * heads * head_dim))


def cpu_paged_attention(q: Tensor, cache: Tensor, tables: Tensor, token_rows: Tensor, positions: Tensor,
                        block_size: int, dtype: str = "float32", scales: Tensor | None = None,
                        spec: AttentionSpec | None = None, sinks: Tensor | None = None) -> Tensor:
    """q [T, H, D]; cache [slots, 2, KVH, D] in the storage of KV dtype `dtype` and, for int8/fp8, its scales
    [slots, 2, KVH] (workers/kv_cache.py); tables [R, max_blocks] int32; token_rows and positions [T] int32: token t
    attends to positions 0..positions[t] of table row token_rows[t] (the last spec.window of them, if set)
    -> [T, H * D]. sinks [H]: gpt-oss's attention sinks."""
    tokens, heads, head_dim = q.shape
    out = Tensor.empty(tokens, heads * head_dim, dtype=dtypes.float32, device=q.device)
    spec = spec or AttentionSpec.plain(head_dim)
    fxn = _program(tokens, heads, cache.shape[2], head_dim, block_size, tables.shape[-1], dtype, spec,
                   sinks is not None)
    cache_inputs = (cache,) if scales is None else (cache, scales)
    return out.custom_kernel(q.float().contiguous(), *cache_inputs, tables.cast(dtypes.int32).contiguous(),
                             token_rows.cast(dtypes.int32).contiguous(), positions.cast(dtypes.int32).contiguous(),
                             *(() if sinks is None else (sinks.float().contiguous(),)), fxn=fxn)[0]
