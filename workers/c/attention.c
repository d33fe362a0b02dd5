// Paged attention over the KV cache in place (workers/cpu_attention.py), run as a tinygrad PROGRAM.
// Specialised by defines: T tokens, H query heads, KVH kv heads, D head dim, BS block size, MAXB blocks per
// table row, CORES, SCALE (a float literal: the scores' scale), WINDOW (attend to the last WINDOW positions only;
// 0: all), SOFTCAP (scores become SOFTCAP * tanh(scores / SOFTCAP); 0.0f: not capped), KV_FORMAT
// (workers/c/kv_formats.h) and QUANTIZED (1: the cache's codes have a float32 scale per slot, k-or-v and kv head, in
// `scales` [slot][2][KVH]); SINKS (gpt-oss: `sinks` [H], a logit per head that joins each softmax and weighs no
// value: the running maximum and sum start from it).
//
// Flash-style tiles: a work item is a tile of up to QT consecutive tokens of one sequence (a prompt chunk's; a
// decode is a tile of one) and one kv head, so its G = H / KVH query heads times its tokens share every key and
// value they load. Keys come KC = 16 at a time: each query's 16 dot products are reduced into one vector of 16
// scores by a transposing tree (no reduction per key), the softmax is online (a running maximum and sum per
// query, the accumulator rescaled when the maximum grows) with its exponentials 16 lanes at a time, and the cache
// is read once per tile, in one pass.
#include "kernel.h"
#include "vector_exp.h"
#include "kv_formats.h"

#define G (H / KVH)
#define DV (D / 16)
#define QT 8   // tokens in a query tile
#define KC 16  // keys in a chunk: one vector of scores
#define QUERIES (QT * G)
#define LINE_VALUES (64 / (int)sizeof(kv_t))  // values in a 64-byte cache line

#if QUANTIZED
#define SCALES_PARAM const float *restrict scales,
#define SCALES_ARG scales,
#define SCALE_OF(slot, part, kvh) scales[((slot) * 2 + (part)) * KVH + (kvh)]
#else
#define SCALES_PARAM
#define SCALES_ARG
#define SCALE_OF(slot, part, kvh) 1.0f
#endif

ALWAYS_INLINE float exp_nonpositive(float x) { return exp_nonpositive16((v16){0} + x)[0]; }

// SOFTCAP * tanh(s / SOFTCAP), tanh from the exponential: tanh|x| = (1 - e^-2|x|) / (1 + e^-2|x|)
ALWAYS_INLINE v16 soft_cap16(v16 s) {
  const i32x16 negative = (i32x16)(s < 0.0f);
  const v16 x = s / SOFTCAP, e = exp_nonpositive16(-2.0f * select16(negative, -x, x)), t = (1.0f - e) / (1.0f + e);
  return SOFTCAP * select16(negative, -t, t);
}

ALWAYS_INLINE v16 max16(v16 a, v16 b) { return select16((i32x16)(a > b), a, b); }
ALWAYS_INLINE float lane_max(v16 v) {
  v = max16(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  v = max16(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  v = max16(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  return v[0] > v[1] ? v[0] : v[1];
}

// lane j of the result = the sum of d[j]'s 16 lanes: pairs of vectors halve their partial sums four times
#define HALVES(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
ALWAYS_INLINE v16 sums_of_16(const v16 *d) {
  v16 w[8], x[4], y[2];
  for (int i = 0; i < 8; i++)  // lanes 0-7: d[2i]'s 8 partial sums, 8-15: d[2i + 1]'s
    w[i] = HALVES(d[2 * i], d[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           HALVES(d[2 * i], d[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; i++)  // lanes 4k .. 4k + 3: d[4i + k]'s 4
    x[i] = HALVES(w[2 * i], w[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           HALVES(w[2 * i], w[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; i++)  // lanes 2k, 2k + 1: d[8i + k]'s 2
    y[i] = HALVES(x[2 * i], x[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           HALVES(x[2 * i], x[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return HALVES(y[0], y[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         HALVES(y[0], y[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// the cache slot of position p of a sequence with block table `table`
ALWAYS_INLINE long slot_at(const int *restrict table, int p) { return (long)table[p / BS] * BS + p % BS; }

// positions p0 .. p0 + KC - 1 of kv head kvh, keys (part 0) or values (part 1), widened into out[j][c] (times their
// scales); positions outside [lo, hi), and any in a block the table no longer holds (-1: freed behind a sliding
// window), are zeros and never read
ALWAYS_INLINE void load_chunk(v16 out[KC][DV], float *restrict chunk_scales, const kv_t *restrict cache,
                              SCALES_PARAM const int *restrict table, int p0, int lo, int hi, int part, int kvh) {
  for (int j = 0; j < KC; j++) {
    const int p = p0 + j;
    if (p < lo || p >= hi || table[p / BS] < 0) {
      for (int c = 0; c < DV; c++) out[j][c] = (v16){0};
      chunk_scales[j] = 0.0f;
      continue;
    }
    const long slot = slot_at(table, p);
    const kv_t *row = cache + (slot * 2 * KVH + part * KVH + kvh) * D;
    for (int c = 0; c < DV; c++) out[j][c] = load16(row + c * 16);
    chunk_scales[j] = SCALE_OF(slot, part, kvh);
    if (p + KC < hi && table[(p + KC) / BS] >= 0) {  // the next chunk's row
      const kv_t *next = cache + (slot_at(table, p + KC) * 2 * KVH + part * KVH + kvh) * D;
      for (int c = 0; c < D; c += LINE_VALUES) __builtin_prefetch(next + c);
    }
  }
}

// token b of a flat batch: a query of the sequence whose block table is row rows[b] of `tables`, at position
// positions[b], so it sees that sequence's positions 0 .. positions[b] (a decode and a prompt chunk alike)
void paged_attention(float *restrict out, const float *restrict q, const kv_t *restrict cache, SCALES_PARAM
                     const int *restrict tables,
                     const int *restrict rows, const int *restrict positions,
#if defined(SINKS)
                     const float *restrict sinks,
#endif
                     int core_id) {
  // tiles: runs of consecutive positions of one table row (a prompt chunk's tokens; a bucket's padding, at
  // position 0 of row 0, is never in a real token's tile), cut every QT tokens
  int tile_start[T + 1], tiles = 0;
  for (int b = 0; b < T; b++)
    if (b == 0 || rows[b] != rows[b - 1] || positions[b] != positions[b - 1] + 1 || b - tile_start[tiles - 1] == QT)
      tile_start[tiles++] = b;
  tile_start[tiles] = T;
  for (int item = core_id; item < tiles * KVH; item += CORES) {  // interleaved: later tiles see more keys
    const int tile = item / KVH, kvh = item % KVH, b0 = tile_start[tile], nt = tile_start[tile + 1] - b0;
    const int *table = tables + (long)rows[b0] * MAXB;
    int first[QT], last[QT], lo = MAXB * BS, hi = 0;  // token t sees positions first[t] .. last[t] - 1
    for (int t = 0; t < nt; t++) {
      int n = positions[b0 + t] + 1;
      n = n < 0 ? 0 : (n > MAXB * BS ? MAXB * BS : n);
      first[t] = WINDOW > 0 && n > WINDOW ? n - WINDOW : 0;
      last[t] = n;
      if (n > first[t]) {
        lo = first[t] < lo ? first[t] : lo;
        hi = n > hi ? n : hi;
      }
    }
    v16 qv[QUERIES][DV], acc[QUERIES][DV];
    float max_score[QUERIES], denom[QUERIES];
    for (int i = 0; i < nt * G; i++) {  // query i: token i / G, head kvh * G + i % G
      for (int c = 0; c < DV; c++) {
        qv[i][c] = *(const v16 *)(q + ((long)(b0 + i / G) * H + kvh * G + i % G) * D + c * 16) * SCALE;
        acc[i][c] = (v16){0};
      }
#if defined(SINKS)
      max_score[i] = sinks[kvh * G + i % G];  // the sink as a key of its own, exp(sink - max) = 1, with no value
      denom[i] = 1.0f;
#else
      max_score[i] = -__builtin_inff();
      denom[i] = 0.0f;
#endif
    }
    for (int p0 = lo; p0 < hi; p0 += KC) {
      v16 k[KC][DV], v[KC][DV];
      float key_scales[KC], value_scales[KC];
      load_chunk(k, key_scales, cache, SCALES_ARG table, p0, lo, hi, 0, kvh);
      load_chunk(v, value_scales, cache, SCALES_ARG table, p0, lo, hi, 1, kvh);
      const v16 ks = *(const v16 *)key_scales, vs = *(const v16 *)value_scales;
      v16 lane_position;
      for (int j = 0; j < KC; j++) lane_position[j] = (float)(p0 + j);
      for (int i = 0; i < nt * G; i++) {
        const int t = i / G;
        if (p0 >= last[t] || p0 + KC <= first[t]) continue;  // none of this chunk's keys are this token's
        v16 dots[KC];
        for (int j = 0; j < KC; j++) {
          v16 dot = qv[i][0] * k[j][0];
          for (int c = 1; c < DV; c++) dot += qv[i][c] * k[j][c];
          dots[j] = dot;
        }
        v16 s = sums_of_16(dots) * ks;
        if (SOFTCAP > 0.0f) s = soft_cap16(s);
        const i32x16 seen = (i32x16)(lane_position >= (float)first[t]) & (i32x16)(lane_position < (float)last[t]);
        s = select16(seen, s, (v16){0} - __builtin_inff());
        const float chunk_max = lane_max(s);
        if (chunk_max > max_score[i]) {  // rescale what was summed under the smaller maximum
          const float r = max_score[i] == -__builtin_inff() ? 0.0f : exp_nonpositive(max_score[i] - chunk_max);
          for (int c = 0; c < DV; c++) acc[i][c] *= r;
          denom[i] *= r;
          max_score[i] = chunk_max;
        }
        const v16 e = select16(seen, exp_nonpositive16(s - max_score[i]), (v16){0});
        denom[i] += lane_sum(e);
        const v16 w = e * vs;
        // only this token's positions: another's value (an inf, say) may not reach its sum even times 0
        const int j_end = last[t] - p0 < KC ? last[t] - p0 : KC;
        for (int j = first[t] > p0 ? first[t] - p0 : 0; j < j_end; j++)
          for (int c = 0; c < DV; c++) acc[i][c] += w[j] * v[j][c];
      }
    }
    for (int i = 0; i < nt * G; i++) {
      const float inv = denom[i] > 0.0f ? 1.0f / denom[i] : 0.0f;
      for (int c = 0; c < DV; c++)
        *(v16 *)(out + ((long)(b0 + i / G) * H + kvh * G + i % G) * D + c * 16) = acc[i][c] * inv;
    }
  }
}
