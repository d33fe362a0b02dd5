"""Paged attention on the CPU backend as one hand-written C kernel that reads the KV cache in place.

tinygrad's version (workers/attention.py) gathers the blocks into a dense copy, then runs the scores, softmax
and weighted sum as separate kernels over `nb` symbolic blocks; on this CPU those ran at ~1 GFLOP/s on one
core. This kernel walks the block table itself, up to each row's own length: per (row, kv head) the scores of
its query heads, a softmax with a vectorised exp, and the weighted sum of the values. A decode row is a
sequence (its own table row and length); a prefill row is one query of a chunk, causal from the chunk's start.
Rows are dealt to the cores round-robin through tinygrad's `core_id`. Like workers/cpu_matvec.py it is
portable C (clang vector extensions) run as a tinygrad PROGRAM (workers/c_kernel.py).
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.renderer import Estimates

from tinyvllm.workers.c_kernel import VECTOR_TYPES, c_kernel

_SOURCE = """#define B {batch}
#define H {heads}
#define KVH {kv_heads}
#define G (H / KVH)
#define D {head_dim}
#define DV (D / 16)
#define BS {block_size}
#define MAXB {max_blocks}
#define ITEMS (B * KVH)
#define CORES {cores}
#define PREFILL {prefill}
#define PF 16  // keys ahead to prefetch

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

// the cache slot of position p of a sequence with block table `table`
static inline long slot_at(const int *restrict table, int p) {{ return (long)table[p / BS] * BS + p % BS; }}

// brings position p's keys (part 0) or values (part 1) for kv head kvh towards the cache, if p < n
static inline void prefetch_position(const float *restrict cache, const int *restrict table, int p, int n, int part,
                                     int kvh) {{
  if (p >= n) return;
  const float *row = cache + (slot_at(table, p) * 2 * KVH + part * KVH + kvh) * D;
  for (int c = 0; c < D; c += 16) __builtin_prefetch(row + c);
}}

// decode: row b is sequence b, with block table row b and length lens[b];
// prefill: row b is query b of one sequence's chunk, at position lens[0] + b, so it sees lens[0] + b + 1 keys
void {name}(float *restrict out, const float *restrict q, const float *restrict cache, const int *restrict tables,
            const int *restrict lens, int core_id) {{
  float scores[G][MAXB * BS];
  for (int item = core_id; item < ITEMS; item += CORES) {{  // interleaved: causal prefill rows grow in cost
    const int b = item / KVH, kvh = item % KVH;
    const int *table = tables + (PREFILL ? 0 : b * MAXB);
    int n = PREFILL ? lens[0] + b + 1 : lens[b];
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
      const float *key = cache + (slot_at(table, p) * 2 * KVH + kvh) * D;
      prefetch_position(cache, table, p + PF, n, 0, kvh);
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
      const float *value = cache + (slot_at(table, p) * 2 * KVH + KVH + kvh) * D;
      prefetch_position(cache, table, p + PF, n, 1, kvh);
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


def _program(rows: int, heads: int, kv_heads: int, head_dim: int, block_size: int, max_blocks: int, prefill: bool):
    items = rows * kv_heads
    cores = max(1, min(NUM_CPU_THREADS.value, items))
    name = f"paged_attention_{'prefill' if prefill else 'decode'}_{rows}_{heads}_{kv_heads}_{head_dim}_{block_size}_{max_blocks}_c{cores}"
    source = VECTOR_TYPES + _SOURCE.format(name=name, batch=rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                            block_size=block_size, max_blocks=max_blocks, cores=cores, prefill=int(prefill),
                            scale=repr(float(head_dim) ** -0.5))
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
