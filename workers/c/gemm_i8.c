// out[ROWS, COLS] = h[ROWS, K] @ weight.T for a Q4_0, Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or Q8_0 weight and more rows
// than matvec_i8.c takes, h given as quantize_i8.c's tiles of int8 codes: int8_rows.h's arithmetic, so every row gets
// the bits matvec_i8.c would give it (a request's tokens do not depend on what shares its steps). Core core_id of CORES
// takes its share of the columns. Two ways, both with one vpdpbusd adding 4 products to each of 16 outputs, so that a
// block's integer sums need no horizontal reduction:
// - fewer than GROUP_MIN_TILES tiles (decode batches) that fit one slab: panels of 4 weight rows, each block unpacked
//   into registers as a vector of a tile's 16 (row, column) pairs and multiplied with every tile there;
// - more (prompt chunks): panels of 16 or 32 weight rows unpacked once per slab of tiles into L1, a vector holding 16
//   weight rows' codes without repeats, each tile's rows broadcast against it.
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
#define GROUP_MIN_TILES 8  // a 512 x 2048 weight on one core, rows: 16 / 32 / 64 / 128, GMAC/s registers vs panels
                           // of 32 weight rows: Q4_K 113 / 140 / 150 / 138 vs 96 / 154 / 186 / 193 (Q8_0, Q4_1 and
                           // Q5_K alike); of 16, Q6_K 96 / 103 / 112 / 110 vs 81 / 102 / 122 / 129 (Q3_K, Q2_K alike)

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

#if TILES < GROUP_MIN_TILES && TILES <= SLAB
// Decode batches: each block of 4 weight rows goes from the weight straight into registers and every tile is
// multiplied with it there (a 4-row panel unpacked into memory first cost as much as multiplying it with a few tiles)
void gemm_i8(float *restrict out, const tile_t *restrict tiles, WEIGHT_PARAMS, int core_id) {
  const int n_end = (core_id + 1) * PER_CORE < COLS ? (core_id + 1) * PER_CORE : COLS;
  for (int n0 = core_id * PER_CORE; n0 < n_end; n0 += 4) {
    const int nr = n_end - n0 < 4 ? n_end - n0 : 4;
    int n[4];
    panel_rows(n0, nr, n);
    f32x16 acc[TILES][8];
    for (int t = 0; t < TILES; t++)
      for (int r = 0; r < 8; r++) acc[t][r] = (f32x16){0};
    int b0 = 0;
    for (; b0 + 8 <= KB; b0 += 8) {
      for (int j = n0 + 4; j < n0 + 8 && j < n_end; j++) prefetch_blocks(WEIGHT_ARGS, j, b0, 8);  // the next panel's
#pragma clang loop unroll(full)
      for (int r = 0; r < 8; r++) {  // r a constant in each copy: a K-quant block's place in its super-block
        panel_block_t pb;
        load_panel_block(WEIGHT_ARGS, n, b0 + r, &pb);
        for (int t = 0; t < TILES; t++) acc[t][r] = block_step(acc[t][r], &tiles[t], &pb, b0 + r);
      }
    }
    for (int j = n0 + 4; b0 < KB && j < n0 + 8 && j < n_end; j++) prefetch_blocks(WEIGHT_ARGS, j, b0, KB - b0);
    for (int r = 0; b0 + r < KB; r++) {
      panel_block_t pb;
      load_panel_block(WEIGHT_ARGS, n, b0 + r, &pb);
      for (int t = 0; t < TILES; t++) acc[t][r] = block_step(acc[t][r], &tiles[t], &pb, b0 + r);
    }
    store_tiles(out, acc, TILES, 0, n0, nr);
  }
}
#else
// More rows (prompt chunks): a panel of GROUP_COLS weight rows and CHUNK_BLOCKS blocks, unpacked once per slab of tiles
// into a stack buffer (in L1), every tile of the slab run against it. A 16-lane vector of the panel holds 16 weight
// rows' dword k (their elements 4k..4k+3) without repeats, and each product broadcasts one activation row's dword, so
// a vector load of weights serves a tile's 4 rows and a block's float epilogue covers 16 outputs. A chunk's blocks
// are stored lane by lane (blocks 0, 8, 16, ..., then 1, 9, ...), so an output's 8 float lanes are summed one after
// the other in registers; between chunks they wait in a scratch buffer per tile of the slab.
#if defined(WEIGHT_HALF_SCALES)
#define GROUP_VECTORS 1
#else
#define GROUP_VECTORS 2
#endif
#define GROUP_COLS (16 * GROUP_VECTORS)
#define CHUNK_BLOCKS 32  // up to 40 kB of panel (1,280 bytes a block): 64 blocks, read from L2, took 1.7x longer
#define SCRATCH_BYTES (8 * 4 * GROUP_COLS * 4)
#define GROUP_SLAB_MAX (SLAB_BYTES / (TILE_BYTES + SCRATCH_BYTES) > 1 ? SLAB_BYTES / (TILE_BYTES + SCRATCH_BYTES) : 1)
#define GROUP_SLABS ((TILES + GROUP_SLAB_MAX - 1) / GROUP_SLAB_MAX)  // the fewest (each unpacks the whole weight)
#define GROUP_SLAB ((TILES + GROUP_SLABS - 1) / GROUP_SLABS)  // of about equal sizes
typedef struct {
  i32x16 codes[8][GROUP_VECTORS];  // [k][v]: lane c = weight row 16v + c's dword k
  f32x16 d[GROUP_VECTORS];
#if defined(WEIGHT_NIBBLES) || defined(WEIGHT_Q2_K)
  f32x16 m[GROUP_VECTORS];
#endif
#if defined(WEIGHT_HALF_SCALES)
  i32x16 half_scale[2][GROUP_VECTORS];
#endif
#if defined(WEIGHT_Q2_K)
  i32x16 half_min[2][GROUP_VECTORS];
#endif
} group_block_t;
typedef f32x16 tile_lanes_t[8][4][GROUP_VECTORS];  // a tile's outputs' 8 float lanes

// the panel's columns in the order transpose_rows leaves them (column c in lane ROW_LANE(c)); store_group puts the
// outputs back in order
#define IN_ORDER(v) __builtin_shufflevector(v, v, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15)

// block b of weight rows n[0..15] into vector v of the panel's block gb
ALWAYS_INLINE void unpack_vector(WEIGHT_PARAMS, const int *restrict n, int b, int v, group_block_t *restrict gb) {
  i32x16 w[8];
  for (int j = 0; j < 8; j++)
    w[j] = __builtin_shufflevector(block_codes(WEIGHT_ARGS, n[2 * j], b), block_codes(WEIGHT_ARGS, n[2 * j + 1], b),
                                   0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  transpose_rows(w, 3);  // columns c, c + 1 in w[c / 2] become dword k of every column in w[k]
  for (int k = 0; k < 8; k++) gb->codes[k][v] = w[k];
  for (int c = 0; c < 16; c++) {
    const long i = (long)n[c] * KB + b;
    const int lane = ROW_LANE(c);
    gb->d[v][lane] = block_scale(WEIGHT_ARGS, i);
#if defined(WEIGHT_NIBBLES) || defined(WEIGHT_Q2_K)
    gb->m[v][lane] = block_min(WEIGHT_ARGS, i);
#endif
#if defined(WEIGHT_HALF_SCALES)
    for (int half = 0; half < 2; half++) {
      gb->half_scale[half][v][lane] = block_half_scale(WEIGHT_ARGS, i, half);
#if defined(WEIGHT_Q2_K)
      gb->half_min[half][v][lane] = block_half_min(WEIGHT_ARGS, i, half);
#endif
    }
#endif
  }
}

// blocks b0 .. b0 + nb - 1 (b0 a multiple of 8) of weight rows n0 .. n0 + GROUP_COLS - 1, lane by lane (rows from
// n_end on repeat row n_end - 1: their outputs are not kept)
ALWAYS_INLINE void unpack_group(WEIGHT_PARAMS, int n0, int n_end, int b0, int nb, group_block_t *restrict panel) {
  int start[8], at = 0;
  for (int lane = 0; lane < 8; lane++) start[lane] = at, at += (nb - lane + 7) / 8;
  for (int v = 0; v < GROUP_VECTORS; v++) {
    int n[16];
    for (int c = 0; c < 16; c++) n[c] = n0 + 16 * v + c < n_end ? n0 + 16 * v + c : n_end - 1;
    int g = 0;
    for (; g + 8 <= nb; g += 8)
#pragma clang loop unroll(full)
      for (int lane = 0; lane < 8; lane++) unpack_vector(WEIGHT_ARGS, n, b0 + g + lane, v, &panel[start[lane] + g / 8]);
    for (int lane = 0; g + lane < nb; lane++)
      unpack_vector(WEIGHT_ARGS, n, b0 + g + lane, v, &panel[start[lane] + g / 8]);
  }
}

#define BROADCAST(x) ((i32x16){0} + (x))
ALWAYS_INLINE f32x16 BROADCAST_F(float x) {  // not 0 + x: that would add, to turn -0 into +0
  const f32x16 v = {x};
  return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}
// the tile's lanes + its products with the panel's blocks b0 .. b0 + nb - 1 (zeros before, if b0 is 0)
ALWAYS_INLINE void tile_group_product(tile_lanes_t lanes, const tile_t *restrict tile, const group_block_t *restrict gb,
                                      int b0, int nb) {
  for (int lane = 0; lane < 8; lane++) {
    f32x16 acc[4][GROUP_VECTORS];
    for (int i = 0; i < 4; i++)
      for (int v = 0; v < GROUP_VECTORS; v++) acc[i][v] = b0 == 0 ? (f32x16){0} : lanes[lane][i][v];
    for (int b = b0 + lane; b < b0 + nb; b += 8, gb++) {
      i32x16 s0[4][GROUP_VECTORS], s1[4][GROUP_VECTORS];
      for (int i = 0; i < 4; i++)
        for (int v = 0; v < GROUP_VECTORS; v++) {
#if defined(OFFSET_CODES)
          s0[i][v] = BROADCAST(tile->offset[b][i]), s1[i][v] = (i32x16){0};
#elif defined(CODE_OFFSET)
          s0[i][v] = BROADCAST(tile->half_sum[b][0][i] * -CODE_OFFSET);
          s1[i][v] = BROADCAST(tile->half_sum[b][1][i] * -CODE_OFFSET);
#else
          s0[i][v] = s1[i][v] = (i32x16){0};
#endif
        }
      for (int k = 0; k < 8; k++)
        for (int v = 0; v < GROUP_VECTORS; v++)
          for (int i = 0; i < 4; i++) {
#if defined(WEIGHT_HALF_SCALES)
            if (k < 4) s0[i][v] = dot4(s0[i][v], gb->codes[k][v], BROADCAST(tile->codes[b][k][i]));
            else s1[i][v] = dot4(s1[i][v], gb->codes[k][v], BROADCAST(tile->codes[b][k][i]));
#else
            s0[i][v] = dot4(s0[i][v], gb->codes[k][v], BROADCAST(tile->codes[b][k][i]));
#endif
          }
      for (int i = 0; i < 4; i++)
        for (int v = 0; v < GROUP_VECTORS; v++) {
#if defined(WEIGHT_HALF_SCALES)
          const i32x16 sum = s0[i][v] * gb->half_scale[0][v] + s1[i][v] * gb->half_scale[1][v];
#else
          const i32x16 sum = s0[i][v] + s1[i][v];
#endif
          acc[i][v] += __builtin_convertvector(sum, f32x16) * (gb->d[v] * BROADCAST_F(tile->d[b][i]));
#if defined(WEIGHT_NIBBLES)
          acc[i][v] += gb->m[v] * BROADCAST_F(tile->m[b][i]);
#elif defined(WEIGHT_Q2_K)
          const i32x16 mins = BROADCAST(tile->half_sum[b][0][i]) * gb->half_min[0][v] +
                              BROADCAST(tile->half_sum[b][1][i]) * gb->half_min[1][v];
          acc[i][v] += __builtin_convertvector(mins, f32x16) * (gb->m[v] * BROADCAST_F(tile->d[b][i]));
#endif
        }
    }
    for (int i = 0; i < 4; i++)
      for (int v = 0; v < GROUP_VECTORS; v++) lanes[lane][i][v] = acc[i][v];
  }
}

// out[4t + i, n0 + c] (rows < ROWS, columns < n_end) from the tile's lanes
ALWAYS_INLINE void store_group(float *restrict out, tile_lanes_t lanes, int t, int n0, int n_end) {
  for (int i = 0; i < 4 && 4 * t + i < ROWS; i++)
    for (int v = 0; v < GROUP_VECTORS; v++) {
      const f32x16 sums = IN_ORDER((((lanes[0][i][v] + lanes[1][i][v]) + (lanes[2][i][v] + lanes[3][i][v])) +
                                    ((lanes[4][i][v] + lanes[5][i][v]) + (lanes[6][i][v] + lanes[7][i][v]))));
      float *restrict row = out + (long)(4 * t + i) * COLS + n0 + 16 * v;
      if (n0 + 16 * v + 16 <= n_end) *(v16 *)row = sums;
      else
        for (int c = 0; c < 16 && n0 + 16 * v + c < n_end; c++) row[c] = sums[c];
    }
}

void gemm_i8(float *restrict out, const tile_t *restrict tiles, WEIGHT_PARAMS, int core_id) {
  group_block_t panel[CHUNK_BLOCKS];
  tile_lanes_t lanes[GROUP_SLAB];
  const int n_end = (core_id + 1) * PER_CORE < COLS ? (core_id + 1) * PER_CORE : COLS;
  for (int s0 = 0; s0 < TILES; s0 += GROUP_SLAB) {
    const int s_end = TILES - s0 < GROUP_SLAB ? TILES : s0 + GROUP_SLAB;
    for (int n0 = core_id * PER_CORE; n0 < n_end; n0 += GROUP_COLS) {
      for (int b0 = 0; b0 < KB; b0 += CHUNK_BLOCKS) {
        const int nb = KB - b0 < CHUNK_BLOCKS ? KB - b0 : CHUNK_BLOCKS;
        unpack_group(WEIGHT_ARGS, n0, n_end, b0, nb, panel);
        for (int t = s0; t < s_end; t++) tile_group_product(lanes[t - s0], &tiles[t], panel, b0, nb);
      }
      for (int t = s0; t < s_end; t++) store_group(out, lanes[t - s0], t, n0, n_end);
    }
  }
}
#endif
