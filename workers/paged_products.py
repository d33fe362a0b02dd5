"""tinygrad's paged attention without a copy of any token's context: the kernels that touch the KV cache read it in
place, through the block table.

Gathering each token's context into a dense tensor ([T, S, 2, KVH, D] float32, S = the step's nb blocks) is what
tinygrad realises when the gather feeds a matmul: per step, a decode batch of 64 on an 8B shape moved ~26 GB that
way and a 2,048-token prompt ~3 TB (benchmarks/step_schedule.py, docs/BENCHMARKS.md). Here, custom kernels over the
positions s < nb * block_size of each token's sequence (nb: the step's symbolic variable, a range bound inside the
kernels), slot(t, s) = tables[token_rows[t], s // block_size] * block_size + s % block_size, and a token's score of
s = q [t, h] . key [slot(t, s), kv head of h] * scale, soft-capped, -inf where the token does not attend s (after its
own position, or outside its window).

Steps whose scores fit SCORES_BUFFER_MAX_BYTES (decode batches: 256 tokens x 32 heads x 8k positions is 256 MiB),
spread over (token, head, position) threads:
- `paged_scores` -> [T, H, max positions] float32, written up to S,
- `paged_weighted_values`: sum over s of exp(score - m) * value [slot(t, s), kv head of h] / l -> [T, H * D],
  with m and l (the softmax's max and sum, sinks included) [T, H] from tinygrad reductions over the first S scores.
  The scores buffer holds every position a sequence may reach: T x H x max_model_len float32 per captured step,
  not counted when the KV cache is sized.
Larger steps (prompt chunks: T x H threads fill a GPU) take one kernel, `paged_attention`: a thread per (token,
head) holds its head_dim outputs in registers, passes over the positions once for the max and once more for the
sum and the weighted values, the scores computed again each time and never stored (flash attention's two-pass form,
without its tiles in shared memory): no buffer grows with max_model_len. Which is faster where, and whether a
head_dim of 256 (Gemma) spills its registers, is for a GPU to measure.

A masked position adds nothing, not even a NaN from a slot that holds another request's data or none. The cache is
read in its storage (float32, float16, bfloat16, and int8 / fp8 codes times their token's scale: workers/kv_quant.py);
tinygrad's CPU backend keeps the gathered path (workers/attention.py: the tests call these kernels directly there).
"""
from __future__ import annotations

import dataclasses
import functools
import math

from tinygrad import Tensor, UOp, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.uop.ops import AxisType, KernelInfo, Ops

from tinyvllm.workers.attention_spec import AttentionSpec
from tinyvllm.workers.kv_quant import decode

# a step whose scores buffer ([T, heads, max positions] float32) would pass this takes the one-kernel attention
SCORES_BUFFER_MAX_BYTES = 256 << 20


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


def _cached(cache_dtype: str, cache: UOp, scales: UOp | None, slot: UOp, j: int, kv_head: UOp, e: UOp) -> UOp:
    """Element e of the key (j = 0) or value (1) at `slot` as float32 (kv_quant.dequantize's arithmetic: the code
    decoded, times its token's scale for int8 / fp8)."""
    value = decode(cache[slot, j, kv_head, e], cache_dtype)
    return value if scales is None else value * scales[slot, j, kv_head]


def _score(cache_dtype: str, block_size: int, spec: AttentionSpec, q: UOp, cache: UOp, scales: UOp | None, tables: UOp,
           token_rows: UOp, positions: UOp, t: UOp, h: UOp, s: UOp, e_axis: int) -> UOp:
    """Token t's head h's score of position s (q.k x scale, soft-capped), -inf where t does not attend s."""
    group = q.shape[1] // cache.shape[2]
    e = UOp.range(q.shape[2], e_axis, AxisType.REDUCE)
    key = _cached(cache_dtype, cache, scales, _slot(cache, tables, token_rows, t, s, block_size), 0, h // group, e)
    score = (q[t, h, e] * key).reduce(e, arg=Ops.ADD) * spec.scale
    if spec.softcap:
        score = (score * (1 / spec.softcap)).tanh() * spec.softcap
    position = positions[t].cast(dtypes.weakint)
    attends = s < position + 1
    if spec.window:
        attends = attends & (position - spec.window < s)
    return attends.where(score, -math.inf)


def _scores_kernel(cache_dtype: str, block_size: int, spec: AttentionSpec, threads: bool, nb: UOp, out: UOp, q: UOp,
                   cache: UOp, tables: UOp, token_rows: UOp, positions: UOp, *scales: UOp) -> UOp:
    T, H, _ = out.shape
    t, h, s = UOp.range(T, 0), UOp.range(H, 1), UOp.range(nb * block_size, 2)
    stored = _score(cache_dtype, block_size, spec, q, cache, scales[0] if scales else None, tables, token_rows,
                    positions, t, h, s, 3)
    return out[t, h, s].store(stored).end(t, h, s).sink(arg=_info(f"paged_scores_{T}_{H}_{q.shape[2]}", threads))


def _weighted_values_kernel(cache_dtype: str, block_size: int, threads: bool, nb: UOp, out: UOp, scores: UOp, m: UOp,
                            total: UOp, cache: UOp, tables: UOp, token_rows: UOp, *scales: UOp) -> UOp:
    T, H, D = out.shape[0], scores.shape[1], cache.shape[3]
    group = H // cache.shape[2]
    t, h, d = UOp.range(T, 0), UOp.range(H, 1), UOp.range(D, 2)
    s = UOp.range(nb * block_size, 3, AxisType.REDUCE)
    score = scores[t, h, s]
    weight = ((score - m[t, h]) * math.log2(math.e)).exp2()
    value = _cached(cache_dtype, cache, scales[0] if scales else None, _slot(cache, tables, token_rows, t, s, block_size),
                    1, h // group, d)
    acc = score.ne(-math.inf).where(weight * value, 0.0).reduce(s, arg=Ops.ADD) / total[t, h]
    return out[t, h * D + d].store(acc).end(t, h, d).sink(arg=_info(f"paged_weighted_values_{T}_{H}_{D}", threads))


def _fused_kernel(cache_dtype: str, block_size: int, spec: AttentionSpec, threads: bool, scaled: bool, nb: UOp, out: UOp,
                  q: UOp, cache: UOp, tables: UOp, token_rows: UOp, positions: UOp, *rest: UOp) -> UOp:
    """One thread per (token, head) and all of its head_dim outputs: the scores' max, then the softmax's sum and the
    weighted values in one more pass over the positions (the scores computed again, never stored). rest: the cache's
    scales (scaled: int8 / fp8), then the sinks if any."""
    T, H, D = q.shape
    group = H // cache.shape[2]
    scales, sinks = (rest[0], rest[1:]) if scaled else (None, rest)
    t, h, d = UOp.range(T, 0), UOp.range(H, 1), UOp.range(D, 2)
    score = functools.partial(_score, cache_dtype, block_size, spec, q, cache, scales, tables, token_rows, positions, t, h)
    s1, s2 = UOp.range(nb * block_size, 3, AxisType.REDUCE), UOp.range(nb * block_size, 5, AxisType.REDUCE)
    m = score(s1, 4).reduce(s1, arg=Ops.MAX)
    if sinks:
        m = m.maximum(sinks[0][h])
    seen = score(s2, 6)
    weight = ((seen - m) * math.log2(math.e)).exp2()
    value = _cached(cache_dtype, cache, scales, _slot(cache, tables, token_rows, t, s2, block_size), 1, h // group, d)
    total = weight.reduce(s2, arg=Ops.ADD)
    acc = seen.ne(-math.inf).where(weight * value, 0.0).reduce(s2, arg=Ops.ADD)
    if sinks:
        total = total + ((sinks[0][h] - m) * math.log2(math.e)).exp2()
    return out[t, h * D + d].store(acc / total).end(t, h, d).sink(
        arg=KernelInfo(name=f"paged_attention_{T}_{H}_{D}", opts_to_apply=_fused_opts(T, D) if threads else ()))


def _fused_opts(T: int, D: int) -> tuple[Opt, ...]:
    """head_dim in each thread's registers (upcast, at most 16 at a time: so the max and the sum are computed once per
    head, not once per output), tokens spread over a workgroup."""
    opts = [Opt(OptOps.UPCAST, 2, 16 if D % 16 == 0 else D)]
    if D % 16 == 0 and D > 16:
        opts.append(Opt(OptOps.UPCAST, 2, D // 16))
    local = next(n for n in (32, 16, 8, 4, 2, 1) if T % n == 0)
    return (*opts, *([Opt(OptOps.LOCAL, 0, local)] if local > 1 else []))


def paged_attention_in_place(q: Tensor, cache: Tensor, tables: Tensor, token_rows: Tensor, positions: Tensor, nb: UOp | int,
                             block_size: int, cache_dtype: str, spec: AttentionSpec, sinks: Tensor | None = None,
                             fused: bool | None = None, scales: Tensor | None = None) -> Tensor:
    """q [T, H, D]; cache [slots, 2, KVH, D] (one layer's, in its storage; scales [slots, 2, KVH] float32 for an int8
    or fp8 cache); tables [R, max_blocks] int32;
    token_rows, positions [T] int32; nb: the blocks attended (the step's bound variable, or an int) -> [T, H * D]
    float32.
    sinks [H]: gpt-oss's attention sinks (a logit per head in every softmax, weighing no value).
    fused: the one-kernel attention (default: where the scores buffer would pass SCORES_BUFFER_MAX_BYTES)."""
    T, H, D = q.shape
    threads = not q.device.startswith("CPU")
    tables, token_rows = tables.cast(dtypes.int32).contiguous(), token_rows.cast(dtypes.int32).contiguous()
    scaled = () if scales is None else (scales,)
    if (T * H * tables.shape[1] * block_size * 4 > SCORES_BUFFER_MAX_BYTES) if fused is None else fused:
        return _call(nb, Tensor.empty(T, H * D, dtype=dtypes.float32, device=q.device), q.float().contiguous(), cache,
                     tables, token_rows, positions.cast(dtypes.int32).contiguous(), *scaled,
                     *(() if sinks is None else (sinks.float().contiguous(),)),
                     fxn=functools.partial(_fused_kernel, cache_dtype, block_size, spec, threads, bool(scaled)))
    scores = _call(nb, Tensor.empty(T, H, tables.shape[1] * block_size, dtype=dtypes.float32, device=q.device),
                   q.float().contiguous(), cache, tables, token_rows, positions.cast(dtypes.int32).contiguous(), *scaled,
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
                 total.contiguous(), cache, tables, token_rows, *scaled,
                 fxn=functools.partial(_weighted_values_kernel, cache_dtype, block_size, threads))
