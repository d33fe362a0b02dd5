// Paged attention over the KV cache in place (workers/cpu_attention.py), run as a tinygrad PROGRAM.
// Specialised by defines: T tokens, H query heads, KVH kv heads, D head dim, BS block size, MAXB blocks per
// table row, CORES, SCALE (a float literal: the scores' scale), WINDOW (attend to the last WINDOW positions only;
// 0: all), SOFTCAP (scores become SOFTCAP * tanh(scores / SOFTCAP); 0.0f: not capped), KV_FORMAT
// (workers/c/kv_formats.h) and QUANTIZED (1: the cache's codes have a float32 scale per slot, k-or-v and kv head, in
// `scales` [slot][2][KVH]).
#include "kernel.h"
#include "kv_formats.h"

#define G (H / KVH)
#define DV (D / 16)
#define ITEMS (T * KVH)
#define PF 16  // keys ahead to prefetch
#define LINE_VALUES (64 / (int)sizeof(kv_t))  // values in a 64-byte cache line

#if QUANTIZED
#define SCALES_PARAM const float *restrict scales,
#define SCALE_OF(slot, part, kvh) scales[((slot) * 2 + (part)) * KVH + (kvh)]
#else
#define SCALES_PARAM
#define SCALE_OF(slot, part, kvh) 1.0f
#endif

// e^x for x <= 0: 2^(x log2 e) as 2^n * 2^f, |f| <= 1/2, 2^f by its Taylor series to degree 7 (~6e-9 error)
ALWAYS_INLINE float exp_nonpositive(float x) {
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
}

// SOFTCAP * tanh(s / SOFTCAP), tanh from exp_nonpositive: tanh|x| = (1 - e^-2|x|) / (1 + e^-2|x|)
ALWAYS_INLINE float soft_cap(float s) {
  const float x = s / SOFTCAP, e = exp_nonpositive(-2.0f * (x < 0 ? -x : x)), t = (1.0f - e) / (1.0f + e);
  return SOFTCAP * (x < 0 ? -t : t);
}

// the cache slot of position p of a sequence with block table `table`
ALWAYS_INLINE long slot_at(const int *restrict table, int p) { return (long)table[p / BS] * BS + p % BS; }

// brings position p's keys (part 0) or values (part 1) for kv head kvh towards the cache, if p < n
ALWAYS_INLINE void prefetch_position(const kv_t *restrict cache, const int *restrict table, int p, int n, int part,
                                     int kvh) {
  if (p >= n) return;
  const kv_t *row = cache + (slot_at(table, p) * 2 * KVH + part * KVH + kvh) * D;
  for (int c = 0; c < D; c += LINE_VALUES) __builtin_prefetch(row + c);
}

// token b of a flat batch: a query of the sequence whose block table is row rows[b] of `tables`, at position
// positions[b], so it sees that sequence's positions 0 .. positions[b] (a decode and a prompt chunk alike)
void paged_attention(float *restrict out, const float *restrict q, const kv_t *restrict cache, SCALES_PARAM
                     const int *restrict tables,
                     const int *restrict rows, const int *restrict positions, int core_id) {
  float scores[G][MAXB * BS];
  for (int item = core_id; item < ITEMS; item += CORES) {  // interleaved: later tokens of a chunk see more keys
    const int b = item / KVH, kvh = item % KVH;
    const int *table = tables + (long)rows[b] * MAXB;
    int n = positions[b] + 1;
    n = n < 0 ? 0 : (n > MAXB * BS ? MAXB * BS : n);
    const int first = WINDOW > 0 && n > WINDOW ? n - WINDOW : 0;
    v16 qv[G][DV], acc[G][DV];
    for (int g = 0; g < G; g++)
      for (int c = 0; c < DV; c++) {
        qv[g][c] = *(const v16 *)(q + ((long)b * H + kvh * G + g) * D + c * 16) * SCALE;
        acc[g][c] = (v16){0};
      }
    float max_score[G];
    for (int g = 0; g < G; g++) max_score[g] = -__builtin_inff();
    for (int p = first; p < n; p++) {
      const long slot = slot_at(table, p);
      const kv_t *key = cache + (slot * 2 * KVH + kvh) * D;
      const float key_scale = SCALE_OF(slot, 0, kvh);
      prefetch_position(cache, table, p + PF, n, 0, kvh);
      v16 k[DV];
      for (int c = 0; c < DV; c++) k[c] = load16(key + c * 16);
      for (int g = 0; g < G; g++) {
        v16 dot = qv[g][0] * k[0];
        for (int c = 1; c < DV; c++) dot += qv[g][c] * k[c];
        const float s = SOFTCAP > 0.0f ? soft_cap(lane_sum(dot) * key_scale) : lane_sum(dot) * key_scale;
        scores[g][p] = s;
        max_score[g] = s > max_score[g] ? s : max_score[g];
      }
    }
    float denom[G];
    for (int g = 0; g < G; g++) {
      float sum = 0.0f;
      for (int p = first; p < n; p++) sum += (scores[g][p] = exp_nonpositive(scores[g][p] - max_score[g]));
      denom[g] = sum > 0.0f ? sum : 1.0f;
    }
    for (int p = first; p < n; p++) {
      const long slot = slot_at(table, p);
      const kv_t *value = cache + (slot * 2 * KVH + KVH + kvh) * D;
      const float value_scale = SCALE_OF(slot, 1, kvh);
      prefetch_position(cache, table, p + PF, n, 1, kvh);
      v16 v[DV];
      for (int c = 0; c < DV; c++) v[c] = load16(value + c * 16);
      for (int g = 0; g < G; g++) {
        const float w = scores[g][p] * value_scale;
        for (int c = 0; c < DV; c++) acc[g][c] += w * v[c];
      }
    }
    for (int g = 0; g < G; g++)
      for (int c = 0; c < DV; c++)
        *(v16 *)(out + ((long)b * H + kvh * G + g) * D + c * 16) = acc[g][c] / denom[g];
  }
}
