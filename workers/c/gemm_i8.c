// out[ROWS, COLS] = h[ROWS, K] @ weight.T for a Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or Q8_0 weight and more rows than
// matvec_i8.c takes, h given as quantize_i8.c's tiles of int8 codes: int8_rows.h's arithmetic, so every row gets the
// bits matvec_i8.c would give it (a request's tokens do not depend on what shares its steps). Core core_id of CORES
// takes its share of the columns in panels of 4 weight rows. A 16-lane vector holds a tile's 16 (row, column) pairs,
// lane 4j + i = row i, column j, so one vpdpbusd adds 4 products to each of 16 outputs and a block's integer sums
// need no horizontal reduction. Up to 32 tiles that fit one slab (L2-sized), each block of a panel is unpacked into
// registers and multiplied with every tile there; beyond, each panel is unpacked once per slab into a stack buffer
// and the slab's tiles run against it two at a time.
#include "kernel.h"
#include "weights.h"
#include "int8_products.h"

#if defined(__AVX512VNNI__) && defined(WEIGHT_Q8_0)
#define OFFSET_CODES 1  // Q8_0 codes + 128 as unsigned bytes (vpdpbusd: unsigned x signed), 128 x the codes' sum taken off
#endif
#define TILES ((ROWS + 3) / 4)
#ifndef SLAB_BYTES
#define SLAB_BYTES 262144  // the tiles a panel meets before the next panel, to stay in L2 (workers/cpu_gemm.py
                           // passes half the core's L2; tests set it smaller)
#endif
#define SLAB (SLAB_BYTES / TILE_BYTES > 1 ? SLAB_BYTES / TILE_BYTES : 1)

typedef int i32x16 __attribute__((vector_size(64), aligned(64)));
typedef float f32x16 __attribute__((vector_size(64), aligned(64)));
#define SPREAD4(v) __builtin_shufflevector(v, v, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3)  // lane 4j + i: v[i]
#define EACH4(v) __builtin_shufflevector(v, v, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)    // lane 4j + i: v[j]

// acc + per lane the sum of the 4 products of w's and x's bytes in it (w: unsigned codes, Q8_0's signed ones without
// VNNI). Q6_K's and Q3_K's codes are their stored unsigned ones, 0..63 and 0..7 (weights.h's unsigned_codes32): each
// 16 codes' CODE_OFFSET is taken from the activations' sums in block_step, so they take vpdpbusd too.
#if defined(__AVX512VNNI__)
#define DOT4_VNNI 1
#endif
#if defined(__AVX2__) && !defined(DOT4_VNNI)
ALWAYS_INLINE __m256i dot4_half(__m256i w, __m256i x) {  // pairs of products fit int16 (see matvec_i8.c)
#if defined(WEIGHT_Q8_0)
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}
#endif
#define HALF(v, h) __builtin_shufflevector(v, v, 8 * h, 8 * h + 1, 8 * h + 2, 8 * h + 3, 8 * h + 4, 8 * h + 5, 8 * h + 6, 8 * h + 7)
#define QUARTER(v, q) __builtin_shufflevector(v, v, 4 * q, 4 * q + 1, 4 * q + 2, 4 * q + 3)
ALWAYS_INLINE i32x16 dot4(i32x16 acc, i32x16 w, i32x16 x) {
#if defined(DOT4_VNNI)
  return (i32x16)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)w, (__m512i)x);
#elif defined(__AVX2__)
  const i32x8 lo = (i32x8)dot4_half((__m256i)HALF(w, 0), (__m256i)HALF(x, 0));
  const i32x8 hi = (i32x8)dot4_half((__m256i)HALF(w, 1), (__m256i)HALF(x, 1));
  return acc + __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#elif defined(__ARM_FEATURE_DOTPROD)
#define DOT_QUARTER(q) (i32x4)vdotq_s32((int32x4_t)QUARTER(acc, q), (int8x16_t)QUARTER(w, q), (int8x16_t)QUARTER(x, q))
  const i32x4 q0 = DOT_QUARTER(0), q1 = DOT_QUARTER(1), q2 = DOT_QUARTER(2), q3 = DOT_QUARTER(3);
  return __builtin_shufflevector(__builtin_shufflevector(q0, q1, 0, 1, 2, 3, 4, 5, 6, 7),
                                 __builtin_shufflevector(q2, q3, 0, 1, 2, 3, 4, 5, 6, 7),
                                 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  const signed char *wb = (const signed char *)&w, *xb = (const signed char *)&x;
  for (int l = 0; l < 16; l++)
    for (int e = 0; e < 4; e++) acc[l] += wb[4 * l + e] * xb[4 * l + e];
  return acc;
#endif
}

// weight row n's block b as 32 code bytes (8 dwords: dword k = elements 4k..4k+3)
ALWAYS_INLINE i32x8 block_codes(WEIGHT_PARAMS, int n, int b) {
#if defined(WEIGHT_NIBBLES)
  return (i32x8)block_codes32(WEIGHT_ARGS, n, b);
#elif defined(WEIGHT_Q2_K)
  return (i32x8)two_bit_codes32(weight, n, b);
#elif defined(CODE_OFFSET)
  return (i32x8)unsigned_codes32(WEIGHT_ARGS, n, b);
#elif defined(OFFSET_CODES)
  return (i32x8)(block_signed_codes(WEIGHT_ARGS, n, b) ^ (signed char)-128);
#else
  return (i32x8)block_signed_codes(WEIGHT_ARGS, n, b);
#endif
}

// weight rows n[0..3]'s block b as the products take it: the codes of row j in lanes 4j..4j+3 (dword k of
// codes[k], for the 4 activation rows of a tile), its scales and minimums likewise
typedef struct {
  i32x16 codes[8];
  f32x16 d, m;
#if defined(WEIGHT_HALF_SCALES)
  i32x16 half_scale[2];  // lane 4j + i: weight row j's scale of elements 0-15, 16-31
#endif
#if defined(WEIGHT_Q2_K)
  i32x16 half_min[2];  // the same for the minimum codes
#endif
} panel_block_t;

#define SPREAD_ROWS(k) __builtin_shufflevector(c01, c23, k, k, k, k, 8 + k, 8 + k, 8 + k, 8 + k, 16 + k, 16 + k, 16 + k, \
                                               16 + k, 24 + k, 24 + k, 24 + k, 24 + k)
ALWAYS_INLINE void load_panel_block(WEIGHT_PARAMS, const int *restrict n, int b, panel_block_t *restrict pb) {
  const i32x16 c01 = __builtin_shufflevector(block_codes(WEIGHT_ARGS, n[0], b), block_codes(WEIGHT_ARGS, n[1], b),
                                             0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const i32x16 c23 = __builtin_shufflevector(block_codes(WEIGHT_ARGS, n[2], b), block_codes(WEIGHT_ARGS, n[3], b),
                                             0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  pb->codes[0] = SPREAD_ROWS(0), pb->codes[1] = SPREAD_ROWS(1), pb->codes[2] = SPREAD_ROWS(2);
  pb->codes[3] = SPREAD_ROWS(3), pb->codes[4] = SPREAD_ROWS(4), pb->codes[5] = SPREAD_ROWS(5);
  pb->codes[6] = SPREAD_ROWS(6), pb->codes[7] = SPREAD_ROWS(7);
  f32x4 ds, ms = {0};
  for (int j = 0; j < 4; j++) {
    ds[j] = block_scale(WEIGHT_ARGS, (long)n[j] * KB + b);
#if defined(WEIGHT_NIBBLES) || defined(WEIGHT_Q2_K)
    ms[j] = block_min(WEIGHT_ARGS, (long)n[j] * KB + b);
#endif
  }
  pb->d = EACH4(ds);
  pb->m = EACH4(ms);
#if defined(WEIGHT_HALF_SCALES)
  for (int half = 0; half < 2; half++) {
    i32x4 hs;
    for (int j = 0; j < 4; j++) hs[j] = block_half_scale(WEIGHT_ARGS, (long)n[j] * KB + b, half);
    pb->half_scale[half] = EACH4(hs);
#if defined(WEIGHT_Q2_K)
    for (int j = 0; j < 4; j++) hs[j] = block_half_min(WEIGHT_ARGS, (long)n[j] * KB + b, half);
    pb->half_min[half] = EACH4(hs);
#endif
  }
#endif
}

// weight rows n0 .. n0 + nr - 1 as n[4] (the rows from nr on repeat the last: their outputs are not kept)
ALWAYS_INLINE void panel_rows(int n0, int nr, int *restrict n) {
  for (int j = 0; j < 4; j++) n[j] = n0 + (j < nr ? j : nr - 1);
}

// acc + block b's products of the tile's rows and the panel's rows (16 pairs)
ALWAYS_INLINE f32x16 block_step(f32x16 acc, const tile_t *restrict tile, const panel_block_t *restrict pb, int b) {
#if defined(OFFSET_CODES)
  i32x16 s0 = SPREAD4(tile->offset[b]), s1 = (i32x16){0};
#elif defined(CODE_OFFSET)  // each half's sum of (code - offset) x = sum code x - offset x (the half's code sum)
  i32x16 s0 = SPREAD4(tile->half_sum[b][0]) * -CODE_OFFSET, s1 = SPREAD4(tile->half_sum[b][1]) * -CODE_OFFSET;
#else
  i32x16 s0 = (i32x16){0}, s1 = (i32x16){0};
#endif
  for (int k = 0; k < 4; k++) s0 = dot4(s0, pb->codes[k], SPREAD4(tile->codes[b][k]));
  for (int k = 4; k < 8; k++) s1 = dot4(s1, pb->codes[k], SPREAD4(tile->codes[b][k]));
#if defined(WEIGHT_HALF_SCALES)  // k 0-3: elements 0-15 (s0), k 4-7: 16-31 (s1)
  const i32x16 sum = s0 * pb->half_scale[0] + s1 * pb->half_scale[1];
#else
  const i32x16 sum = s0 + s1;
#endif
  acc += __builtin_convertvector(sum, f32x16) * (pb->d * SPREAD4(tile->d[b]));
#if defined(WEIGHT_NIBBLES)
  acc += pb->m * SPREAD4(tile->m[b]);
#elif defined(WEIGHT_Q2_K)
  const i32x16 mins = SPREAD4(tile->half_sum[b][0]) * pb->half_min[0] + SPREAD4(tile->half_sum[b][1]) * pb->half_min[1];
  acc += __builtin_convertvector(mins, f32x16) * (pb->m * SPREAD4(tile->d[b]));
#endif
  return acc;
}

// out[r0 + 4t + i, n0 + j] from the count tiles' accumulators (rows < ROWS, the panel's rows j < nr)
ALWAYS_INLINE void store_tiles(float *restrict out, f32x16 (*acc)[8], int count, int r0, int n0, int nr) {
  for (int t = 0; t < count; t++) {
    const f32x16 sums = LANE_SUM8(acc[t]);
    for (int j = 0; j < nr; j++)
      for (int i = 0; i < 4 && r0 + 4 * t + i < ROWS; i++) out[(long)(r0 + 4 * t + i) * COLS + n0 + j] = sums[4 * j + i];
  }
}

#if TILES <= 32 && TILES <= SLAB
// Up to 128 rows whose tiles fit one slab (decode batches, short prompt chunks): each block of 4 weight rows goes
// from the weight straight into registers and every tile is multiplied with it there (a panel unpacked into memory
// first, as below, cost as much as multiplying it with a few tiles: 4096 x 4096 Q4_K, 16 rows 2,100 -> 1,536 us,
// 64 rows 5,916 -> 4,769, 128 rows 12,192 -> 10,152)
void gemm_i8(float *restrict out, const tile_t *restrict tiles, WEIGHT_PARAMS, int core_id) {
  const int n_end = (core_id + 1) * PER_CORE < COLS ? (core_id + 1) * PER_CORE : COLS;
  for (int n0 = core_id * PER_CORE; n0 < n_end; n0 += 4) {
    const int nr = n_end - n0 < 4 ? n_end - n0 : 4;
    int n[4];
    panel_rows(n0, nr, n);
    for (int j = n0 + 4; j < n0 + 8 && j < n_end; j++) prefetch_row(WEIGHT_ARGS, j);  // the next panel (as matvec_i8)
    f32x16 acc[TILES][8];
    for (int t = 0; t < TILES; t++)
      for (int r = 0; r < 8; r++) acc[t][r] = (f32x16){0};
    int b0 = 0;
    for (; b0 + 8 <= KB; b0 += 8) {
#pragma clang loop unroll(full)
      for (int r = 0; r < 8; r++) {  // r a constant in each copy: a K-quant block's place in its super-block
        panel_block_t pb;
        load_panel_block(WEIGHT_ARGS, n, b0 + r, &pb);
        for (int t = 0; t < TILES; t++) acc[t][r] = block_step(acc[t][r], &tiles[t], &pb, b0 + r);
      }
    }
    for (int r = 0; b0 + r < KB; r++) {
      panel_block_t pb;
      load_panel_block(WEIGHT_ARGS, n, b0 + r, &pb);
      for (int t = 0; t < TILES; t++) acc[t][r] = block_step(acc[t][r], &tiles[t], &pb, b0 + r);
    }
    store_tiles(out, acc, TILES, 0, n0, nr);
  }
}
#else
// weight rows n0 .. n0 + nr - 1 unpacked once per slab of tiles into a stack buffer (640 bytes per block, 768 with
// half-block scales, 896 with Q2_K's minimums too), every tile of the slab run against it, two at a time
typedef struct {
  panel_block_t blocks[KB];
} panel_t;

ALWAYS_INLINE void unpack_panel(WEIGHT_PARAMS, int n0, int nr, panel_t *restrict panel) {
  int n[4];
  panel_rows(n0, nr, n);
  for (int b0 = 0; b0 < KB; b0 += BLOCK_GROUP)
#pragma unroll
    for (int b = b0; b < b0 + BLOCK_GROUP; b++) load_panel_block(WEIGHT_ARGS, n, b, &panel->blocks[b]);
}

// out[r0 + i, n0 + j] for `count` (1 or 2) tiles from r0 (rows < ROWS) and the panel's rows j < nr
ALWAYS_INLINE void tiles_product(float *restrict out, const tile_t *restrict tiles, int count, const panel_t *restrict panel,
                                 int r0, int n0, int nr) {
  f32x16 acc[2][8];
  for (int t = 0; t < count; t++)
    for (int r = 0; r < 8; r++) acc[t][r] = (f32x16){0};
  int b0 = 0;
  for (; b0 + 8 <= KB; b0 += 8) {
#pragma clang loop unroll(full)
    for (int r = 0; r < 8; r++)
      for (int t = 0; t < count; t++) acc[t][r] = block_step(acc[t][r], &tiles[t], &panel->blocks[b0 + r], b0 + r);
  }
  for (int r = 0; b0 + r < KB; r++)
    for (int t = 0; t < count; t++) acc[t][r] = block_step(acc[t][r], &tiles[t], &panel->blocks[b0 + r], b0 + r);
  store_tiles(out, acc, count, r0, n0, nr);
}

void gemm_i8(float *restrict out, const tile_t *restrict tiles, WEIGHT_PARAMS, int core_id) {
  panel_t panel;
  const int n_end = (core_id + 1) * PER_CORE < COLS ? (core_id + 1) * PER_CORE : COLS;
  for (int s0 = 0; s0 < TILES; s0 += SLAB) {
    const int s_end = TILES - s0 < SLAB ? TILES : s0 + SLAB;
    for (int n0 = core_id * PER_CORE; n0 < n_end; n0 += 4) {
      const int nr = n_end - n0 < 4 ? n_end - n0 : 4;
      unpack_panel(WEIGHT_ARGS, n0, nr, &panel);
      int t = s0;
      for (; t + 2 <= s_end; t += 2) tiles_product(out, &tiles[t], 2, &panel, 4 * t, n0, nr);
      if (t < s_end) tiles_product(out, &tiles[t], 1, &panel, 4 * t, n0, nr);
    }
  }
}
#endif
