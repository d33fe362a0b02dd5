"""Decode attention on the CPU backend as one hand-written C kernel that reads the paged KV cache in place.

tinygrad's version (workers/attention.py) gathers every sequence's blocks into a dense copy, then runs the
scores, softmax and weighted sum as separate kernels over `nb` symbolic blocks; on this CPU those kernels ran
at ~1 GFLOP/s and did not use the second core. This kernel walks each sequence's block table itself, up to the
sequence's own length: per (sequence, kv head) the scores of its query heads, a softmax with a vectorised
exp, and the weighted sum of the values. Work items are split across cores through tinygrad's `core_id`.
Like workers/cpu_matvec.py it is a tinygrad PROGRAM in portable C vector extensions.
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.renderer import Estimates
from tinygrad.uop.ops import KernelInfo, Ops, ProgramInfo, UOp

_SOURCE = """typedef float v16 __attribute__((vector_size(64), aligned(4)));
#define B {batch}
#define H {heads}
#define KVH {kv_heads}
#define G (H / KVH)
#define D {head_dim}
#define DV (D / 16)
#define BS {block_size}
#define MAXB {max_blocks}
#define ITEMS (B * KVH)
#define PER_CORE {per_core}

static inline float lane_sum(v16 v) {{
#pragma clang fp reassociate(on)
  float s = 0.0f;
  for (int i = 0; i < 16; i++) s += v[i];
  return s;
}}

// e^x for x <= 0: 2^(x log2 e) as 2^n * 2^f, |f| <= 1/2, 2^f by its Taylor series to degree 7 (~6e-9 error)
static inline float exp_nonpositive(float x) {{
  float t = x * 1.4426950408889634f;
  t = t < -126.0f ? -126.0f : t;
  const float n = __builtin_floorf(t + 0.5f), f = t - n;
  float p = 1.5252733804059841e-5f;
  p = p * f + 1.5403530393381608e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.0f;
  const int bits = ((int)n + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, 4);
  return p * scale;
}}

void {name}(float *restrict out, const float *restrict q, const float *restrict cache, const int *restrict tables,
            const int *restrict lens, int core_id) {{
  float scores[G][MAXB * BS];
  const int end = (core_id + 1) * PER_CORE < ITEMS ? (core_id + 1) * PER_CORE : ITEMS;
  for (int item = core_id * PER_CORE; item < end; item++) {{
    const int b = item / KVH, kvh = item % KVH;
    int n = lens[b];
    n = n < 0 ? 0 : (n > MAXB * BS ? MAXB * BS : n);
    v16 qv[G][DV], acc[G][DV];
    for (int g = 0; g < G; g++)
      for (int c = 0; c < DV; c++) {{
        qv[g][c] = *(const v16 *)(q + ((long)b * H + kvh * G + g) * D + c * 16) * {scale}f;
        acc[g][c] = (v16){{0}};
      }}
    float max_score[G];
    for (int g = 0; g < G; g++) max_score[g] = -__builtin_inff();
    for (int p = 0; p < n; p++) {{
      const long slot = (long)tables[b * MAXB + p / BS] * BS + p % BS;
      const float *key = cache + (slot * 2 * KVH + kvh) * D;
      for (int g = 0; g < G; g++) {{
        v16 dot = qv[g][0] * *(const v16 *)key;
        for (int c = 1; c < DV; c++) dot += qv[g][c] * *(const v16 *)(key + c * 16);
        const float s = lane_sum(dot);
        scores[g][p] = s;
        max_score[g] = s > max_score[g] ? s : max_score[g];
      }}
    }}
    float denom[G];
    for (int g = 0; g < G; g++) {{
      float sum = 0.0f;
      for (int p = 0; p < n; p++) sum += (scores[g][p] = exp_nonpositive(scores[g][p] - max_score[g]));
      denom[g] = sum > 0.0f ? sum : 1.0f;
    }}
    for (int p = 0; p < n; p++) {{
      const long slot = (long)tables[b * MAXB + p / BS] * BS + p % BS;
      const float *value = cache + (slot * 2 * KVH + KVH + kvh) * D;
      for (int g = 0; g < G; g++)
        for (int c = 0; c < DV; c++) acc[g][c] += scores[g][p] * *(const v16 *)(value + c * 16);
    }}
    for (int g = 0; g < G; g++)
      for (int c = 0; c < DV; c++)
        *(v16 *)(out + ((long)b * H + kvh * G + g) * D + c * 16) = acc[g][c] / denom[g];
  }}
}}
"""


def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
    return head_dim % 16 == 0 and heads % kv_heads == 0


def _program(batch: int, heads: int, kv_heads: int, head_dim: int, block_size: int, max_blocks: int):
    items = batch * kv_heads
    cores = max(1, min(NUM_CPU_THREADS.value, items))
    name = f"paged_attention_decode_{batch}_{heads}_{kv_heads}_{head_dim}_{block_size}_{max_blocks}_c{cores}"
    source = _SOURCE.format(name=name, batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                            block_size=block_size, max_blocks=max_blocks, per_core=-(-items // cores),
                            scale=repr(float(head_dim) ** -0.5))

    def fxn(*params: UOp) -> UOp:
        core = UOp.variable("core_id", 0, cores - 1, dtypes.int, param=True)
        sink = UOp.sink(*params, core, arg=KernelInfo(name=name, estimates=Estimates(ops=4 * batch * heads * head_dim)))
        info = ProgramInfo(name=name, global_size=(cores, 1, 1), local_size=(1, 1, 1), vars=(core,),
                           globals=tuple(range(len(params))), outs=(0,), ins=tuple(range(1, len(params))))
        return UOp(Ops.PROGRAM, src=(sink, UOp(Ops.LINEAR, src=(*sink.src, sink)), UOp(Ops.SOURCE, arg=source)), arg=info)
    return fxn


def cpu_decode_attention(q: Tensor, cache: Tensor, block_tables: Tensor, context_lens: Tensor, block_size: int) -> Tensor:
    """q [B, H, D]; cache [slots, 2, KVH, D] (workers/kv_cache.py); block_tables [B, max_blocks] int32;
    context_lens [B] int32 (row b attends to its first context_lens[b] positions) -> [B, H * D]."""
    batch, heads, head_dim = q.shape
    kv_heads, max_blocks = cache.shape[2], block_tables.shape[1]
    out = Tensor.empty(batch, heads * head_dim, dtype=dtypes.float32, device=q.device)
    fxn = _program(batch, heads, kv_heads, head_dim, block_size, max_blocks)
    return out.custom_kernel(q.float().contiguous(), cache, block_tables.cast(dtypes.int32).contiguous(),
                             context_lens.cast(dtypes.int32).contiguous(), fxn=fxn)[0]
