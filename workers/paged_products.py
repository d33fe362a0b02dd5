"""tinygrad's paged attention without a copy of any token's context: the two kernels that touch the KV cache read it
in place, through the block table.

Gathering each token's context into a dense tensor ([T, S, 2, KVH, D] float32, S = the step's nb blocks) is what
tinygrad realises when the gather feeds a matmul: per step, a decode batch of 64 on an 8B shape moved ~26 GB that
way and a 2,048-token prompt ~3 TB (benchmarks/step_schedule.py, docs/BENCHMARKS.md). Here, two custom kernels over the positions
s < nb * block_size of each token's sequence (nb: the step's symbolic variable, a range bound inside the kernels):
- `paged_scores`: q [T, H, D] . key [slot(t, s), kv head of h] * scale, soft-capped, -inf where the token does not
  attend (after its own position, or outside its window) -> [T, H, max positions] float32, written up to S,
- `paged_weighted_values`: sum over s of exp(score - m) * value [slot(t, s), kv head of h] / l -> [T, H, D],
  with m and l (the softmax's max and sum, sinks included) [T, H] from tinygrad reductions over the first S scores;
slot(t, s) = tables[token_rows[t], s // block_size] * block_size + s % block_size. A masked position adds nothing,
not even a NaN from a slot that holds another request's data or none. The scores buffer holds every position a
sequence may reach: T x H x max_model_len float32 per captured step (2,048 tokens x 32 heads x 8k positions: 2 GB),
not counted when the KV cache is sized; about 2 x kv_heads x head_dim / heads times less than the gathered copy at a
full context, but bound by max_model_len, not the context the step has. The cache is read in its storage (float32,
float16, bfloat16: workers/kv_quant.py); the quantised dtypes (int8, fp8 and their scales) keep the gathered path, as
tinygrad's CPU backend does (workers/attention.py: the tests call these kernels directly there).
"""
from __future__ import annotations

import dataclasses
import functools
import math

from tinygrad import Tensor, UOp, dtypes
from tinygrad.uop.ops import AxisType, KernelInfo, Ops

from tinyvllm.workers.attention_spec import AttentionSpec
from tinyvllm.workers.kv_quant import decode

IN_PLACE_DTYPES = ("float32", "float16", "bfloat16")


def _call(nb: UOp | int, out: Tensor, *srcs: Tensor, fxn) -> Tensor:
    """out.custom_kernel(*srcs, fxn=...) whose kernel also reads nb, a bound variable (fxn gets its kernel-side form
    first: Tensor.custom_kernel passes buffers only) or an int."""
    if isinstance(nb, int):
        return out.custom_kernel(*srcs, fxn=functools.partial(fxn, nb))[0]
    bound_var = nb
    var = bound_var.unbind()[0]
    uops = (out.uop, *(s.uop for s in srcs))
    unique = list(dict.fromkeys(uops))  # a buffer passed twice (two equal inputs) is one argument of the call
    placeholders = {u: UOp.placeholder_like(u, slot=i) for i, u in enumerate(unique)}
    # a slot of its own, past the buffers': the C renderer names a scalar parameter by its slot, and -1 (tinygrad's
    # own variables' in its kernels) trips the linearizer's ordering here
    param = UOp(Ops.PARAM, var.dtype, src=var.src, arg=dataclasses.replace(var.arg, slot=len(unique)))
    kernel = fxn(param, *(placeholders[u] for u in uops)).call(*unique, bound_var)
    return Tensor(out.uop.after(kernel))


def _slot(cache: UOp, tables: UOp, token_rows: UOp, t: UOp, s: UOp, block_size: int) -> UOp:
    """A block freed behind a window is -1 in its table (its positions are masked): clamped to a real block, so no
    index leaves the cache (and none needs wrapping)."""
    block = tables[token_rows[t].cast(dtypes.weakint), s // block_size].cast(dtypes.weakint)
    return block.maximum(0).minimum(cache.shape[0] // block_size - 1) * block_size + s % block_size


def _info(name: str, threads: bool) -> KernelInfo:
    """threads=False: no opts at all, so tinygrad's CPU backend does not split the kernel over its cores (its
    core_id beside the kernel's own variable is not passed right by tinygrad 0.14's CPU runtime)."""
    return KernelInfo(name=name, opts_to_apply=None if threads else ())


def _scores_kernel(cache_dtype: str, block_size: int, spec: AttentionSpec, threads: bool, nb: UOp, out: UOp, q: UOp,
                   cache: UOp, tables: UOp, token_rows: UOp, positions: UOp) -> UOp:
    T, H, _ = out.shape
    D, group = q.shape[2], H // cache.shape[2]
    t, h, s = UOp.range(T, 0), UOp.range(H, 1), UOp.range(nb * block_size, 2)
    e = UOp.range(D, 3, AxisType.REDUCE)
    key = decode(cache[_slot(cache, tables, token_rows, t, s, block_size), 0, h // group, e], cache_dtype)
    score = (q[t, h, e] * key).reduce(e, arg=Ops.ADD) * spec.scale
    if spec.softcap:
        score = (score * (1 / spec.softcap)).tanh() * spec.softcap
    position = positions[t].cast(dtypes.weakint)
    attends = s < position + 1
    if spec.window:
        attends = attends & (position - spec.window < s)
    stored = attends.where(score, -math.inf)
    return out[t, h, s].store(stored).end(t, h, s).sink(arg=_info(f"paged_scores_{T}_{H}_{D}", threads))


def _weighted_values_kernel(cache_dtype: str, block_size: int, threads: bool, nb: UOp, out: UOp, scores: UOp, m: UOp,
                            total: UOp, cache: UOp, tables: UOp, token_rows: UOp) -> UOp:
    T, H, D = out.shape[0], scores.shape[1], cache.shape[3]
    group = H // cache.shape[2]
    t, h, d = UOp.range(T, 0), UOp.range(H, 1), UOp.range(D, 2)
    s = UOp.range(nb * block_size, 3, AxisType.REDUCE)
    score = scores[t, h, s]
    weight = ((score - m[t, h]) * math.log2(math.e)).exp2()
    value = decode(cache[_slot(cache, tables, token_rows, t, s, block_size), 1, h // group, d], cache_dtype)
    acc = score.ne(-math.inf).where(weight * value, 0.0).reduce(s, arg=Ops.ADD) / total[t, h]
    return out[t, h * D + d].store(acc).end(t, h, d).sink(arg=_info(f"paged_weighted_values_{T}_{H}_{D}", threads))


def paged_attention_in_place(q: Tensor, cache: Tensor, tables: Tensor, token_rows: Tensor, positions: Tensor, nb: UOp | int,
                             block_size: int, cache_dtype: str, spec: AttentionSpec, sinks: Tensor | None = None) -> Tensor:
    """q [T, H, D]; cache [slots, 2, KVH, D] (one layer's, in its storage); tables [R, max_blocks] int32;
    token_rows, positions [T] int32; nb: the blocks attended (the step's bound variable, or an int) -> [T, H * D]
    float32.
    sinks [H]: gpt-oss's attention sinks (a logit per head in every softmax, weighing no value)."""
    T, H, D = q.shape
    threads = not q.device.startswith("CPU")
    tables, token_rows = tables.cast(dtypes.int32).contiguous(), token_rows.cast(dtypes.int32).contiguous()
    scores = _call(nb, Tensor.empty(T, H, tables.shape[1] * block_size, dtype=dtypes.float32, device=q.device),
                   q.float().contiguous(), cache, tables, token_rows, positions.cast(dtypes.int32).contiguous(),
                   fxn=functools.partial(_scores_kernel, cache_dtype, block_size, spec, threads))
    seen = scores[:, :, :nb * block_size]
    m = seen.max(-1)
    if sinks is not None:
        m = m.maximum(sinks.float().reshape(1, H))
    m = m.contiguous()  # one buffer for the sum and the kernel (else each makes its own)
    total = (seen - m.unsqueeze(-1)).exp().sum(-1)
    if sinks is not None:
        total = total + (sinks.float().reshape(1, H) - m).exp()
    # [T, H * D] as the output projection reads it (a reshape of the kernel's output would be copied)
    return _call(nb, Tensor.empty(T, H * D, dtype=dtypes.float32, device=q.device), scores, m,
                 total.contiguous(), cache, tables, token_rows,
                 fxn=functools.partial(_weighted_values_kernel, cache_dtype, block_size, threads))
