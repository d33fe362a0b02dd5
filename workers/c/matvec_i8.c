// out[ROWS, COLS] = h[ROWS, K] @ weight.T for a few rows and a Q4_0, Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or Q8_0 weight, with h
// quantised to int8 per 32-element block and each block's products summed as integers: 4 multiplies per instruction
// lane (VNNI's vpdpbusd, AVX2's vpmaddubsw + vpmaddwd, NEON's sdot), where the float32 kernel (matvec.c) widens every weight
// to a float first. Core core_id of CORES computes its share of the columns; each core quantises h itself
// (ROWS x K, small next to the weight it reads). The arithmetic is int8_rows.h's, as gemm_i8.c's for more rows:
// here the 8 float lanes are 8 consecutive blocks of one output, their integer sums reduced by a
// transpose-and-add tree.
#include "kernel.h"
#include "weights.h"
#include "int8_products.h"

#define PREFETCH_AHEAD 4
#if (defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(WEIGHT_NIBBLES) && KB % 8 == 0) || \
    (defined(__AVX512BW__) && defined(WEIGHT_Q6_K))
// two blocks per 512-bit product (the nibble kinds' vpdpbusd; Q6_K's unsigned codes in vpmaddubsw + vpmaddwd with
// its half-block scales): half the dot instructions and activation loads per row, and a shorter tree to each
// block's sum
#define PAIRED_BLOCKS 1
#endif
#if defined(CODE_OFFSET) && defined(__AVX2__)
// Q6_K's and Q3_K's codes multiplied as they are stored, 0..63 and 0..7 (unsigned, as maddubs takes them: no sign
// instructions), and the CODE_OFFSET (32, 4) taken once per 8 blocks from the activations' 16-element sums:
// sum (c - 32) x = sum c x - 32 sum x
#define UNSIGNED_CODES 1
#endif
#if defined(UNSIGNED_CODES) || defined(WEIGHT_Q2_K)
#define X_HALF_SUMS 1  // the activations' 16-element code sums (Q6_K's and Q3_K's offsets, Q2_K's minimums take them)
#endif

// weight row n's block b as the instructions take it (loaded and unpacked once for every activation row)
#if defined(__AVX2__)
typedef struct { __m256i u, w; } block_t;  // u: the unsigned factor (nibble kinds' codes, Q6_K's 0..63, Q2_K's
                                            // 0..3, signed ones' |w|); w: signs
#elif defined(__ARM_FEATURE_DOTPROD)
typedef struct { int8x16_t w0, w1; } block_t;
#else
typedef struct { signed char w[32]; } block_t;
#endif

ALWAYS_INLINE block_t load_block(WEIGHT_PARAMS, int n, int b) {
  block_t blk;
#if defined(WEIGHT_NIBBLES) || defined(WEIGHT_Q2_K) || defined(UNSIGNED_CODES)  // codes taken as they are
#if defined(WEIGHT_NIBBLES)
  const u8x32 c = block_codes32(WEIGHT_ARGS, n, b);
#elif defined(WEIGHT_Q2_K)
  const u8x32 c = two_bit_codes32(weight, n, b);
#else
  const u8x32 c = unsigned_codes32(WEIGHT_ARGS, n, b);
#endif
#if defined(__AVX2__)
  blk.u = blk.w = (__m256i)c;
#elif defined(__ARM_FEATURE_DOTPROD)
  blk.w0 = vreinterpretq_s8_u8((uint8x16_t)LOW_HALF(c));
  blk.w1 = vreinterpretq_s8_u8((uint8x16_t)HIGH_HALF(c));
#else
  for (int e = 0; e < 32; e++) blk.w[e] = (signed char)c[e];
#endif
#else
  const i8x32 q = block_signed_codes(WEIGHT_ARGS, n, b);
#if defined(__AVX2__)  // unsigned |w| times x with w's sign: the u8 x s8 products the instructions take
  blk.w = (__m256i)q;
  blk.u = _mm256_sign_epi8(blk.w, blk.w);
#elif defined(__ARM_FEATURE_DOTPROD)
  blk.w0 = (int8x16_t)LOW_HALF(q), blk.w1 = (int8x16_t)HIGH_HALF(q);
#else
  for (int e = 0; e < 32; e++) blk.w[e] = q[e];
#endif
#endif
  return blk;
}

// Q6_K, Q3_K, Q2_K: block b0 + i's half-block scales as block_dot multiplies its lanes: with AVX2 16-bit ones for
// madd, lanes 0-7 elements 0-15's scale and 8-15 16-31's (one byte shuffle of the 8 blocks' scales, widened once: the
// compiler keeps that across the unrolled blocks), else 32-bit ones for lanes 0-3 and 4-7
#if defined(__AVX2__)
typedef __m256i half_scales_t;
#else
typedef i32x8 half_scales_t;
#endif
#if defined(WEIGHT_HALF_SCALES)
ALWAYS_INLINE half_scales_t half_scales(WEIGHT_PARAMS, int n, int b0, int i) {
#if defined(__AVX2__)
  // s0, s1 of block b0, then of b0 + 1, ... as signed bytes
#if defined(WEIGHT_Q2_K)
  const __m128i sc = _mm_and_si128(_mm_loadu_si128((const __m128i *)(codes + ((long)n * KB + b0) * 2)), _mm_set1_epi8(15));
#else
  const __m128i sc = _mm_loadu_si128((const __m128i *)(scales + ((long)n * KB + b0) * 2));
#endif
  // the 8 blocks' scales as int16: lane 2k + h of `wide` holds block k's scale of half h (in both 128-bit halves)
  const __m128i wide = _mm_cvtepi8_epi16(sc);
  const __m128i wide_hi = _mm_cvtepi8_epi16(_mm_srli_si128(sc, 8));
  const __m128i s = i < 4 ? wide : wide_hi;
  const int k = i % 4;  // block i's pair of 16-bit lanes in s
  const __m128i h0 = _mm_shuffle_epi8(s, _mm_set1_epi16((short)((4 * k + 1) << 8 | 4 * k)));
  const __m128i h1 = _mm_shuffle_epi8(s, _mm_set1_epi16((short)((4 * k + 3) << 8 | (4 * k + 2))));
  return _mm256_set_m128i(h1, h0);
#else
  const int s0 = block_half_scale(WEIGHT_ARGS, (long)n * KB + b0 + i, 0);
  const int s1 = block_half_scale(WEIGHT_ARGS, (long)n * KB + b0 + i, 1);
  return (i32x8){s0, s0, s0, s0, s1, s1, s1, s1};
#endif
}
#endif

// the block's 8 int32 lanes against the activation codes x[32] (see the top); Q6_K, Q3_K, Q2_K: each half's lanes
// times its scale (`scales`, from half_scales; other kinds ignore it)
ALWAYS_INLINE i32x8 block_dot(block_t blk, const signed char *restrict x, half_scales_t scales) {
#if defined(__AVX2__)
  const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
#if defined(WEIGHT_NIBBLES) || defined(UNSIGNED_CODES) || defined(WEIGHT_Q2_K)
  const __m256i s = xv;
#else
  const __m256i s = _mm256_sign_epi8(xv, blk.w);
#endif
#if defined(WEIGHT_HALF_SCALES)  // the scales as madd's second factor instead of ones: no multiply of their own
  return (i32x8)_mm256_madd_epi16(_mm256_maddubs_epi16(blk.u, s), scales);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return (i32x8)_mm256_dpbusd_epi32(_mm256_setzero_si256(), blk.u, s);
#else  // pairs of products fit int16 unsaturated: 31 * 127 * 2 and 128 * 127 * 2 are under 32767
  return (i32x8)_mm256_madd_epi16(_mm256_maddubs_epi16(blk.u, s), _mm256_set1_epi16(1));
#endif
#else
#if defined(__ARM_FEATURE_DOTPROD)
  const int32x4_t lo = vdotq_s32(vdupq_n_s32(0), blk.w0, vld1q_s8(x));
  const int32x4_t hi = vdotq_s32(vdupq_n_s32(0), blk.w1, vld1q_s8(x + 16));
  const i32x8 lanes = {lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]};
#else
  i32x8 lanes = {0};
  for (int e = 0; e < 32; e++) lanes[e / 4] += blk.w[e] * x[e];
#endif
#if defined(WEIGHT_HALF_SCALES)
  return lanes * scales;
#else
  (void)scales;
  return lanes;
#endif
#endif
}

#if defined(PAIRED_BLOCKS)
typedef int i32x16 __attribute__((vector_size(64), aligned(64)));

#define SPREAD16(a, b, c, d) _mm512_set_epi64((d) * 0x0001000100010001LL, (d) * 0x0001000100010001LL, \
  (c) * 0x0001000100010001LL, (c) * 0x0001000100010001LL, (b) * 0x0001000100010001LL, (b) * 0x0001000100010001LL, \
  (a) * 0x0001000100010001LL, (a) * 0x0001000100010001LL)  // 16-bit lanes 0-7 a, 8-15 b, 16-23 c, 24-31 d

// weight row n's blocks b and b + 1 (b even) as 64 codes, each block's 32 elements in order (Q6_K: 0..63)
ALWAYS_INLINE __m512i load_block_pair(WEIGHT_PARAMS, int n, int b) {
#if defined(WEIGHT_Q6_K)  // b and b + 1's low nibbles are the 64 bytes of their half; their high pairs the same 32
  const unsigned j = (unsigned)b % 8;
  const unsigned long super = (unsigned long)n * (KB / 8) + (unsigned)b / 8;
  const __m512i low = _mm512_loadu_si512(weight + super * 128 + j / 4 * 64);
  const __m512i pairs = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(high + super * 64 + j / 4 * 32)));
  const unsigned s = 2 * (j % 4);  // b's pair in bits s, s + 1; b + 1's in s + 2, s + 3
  return _mm512_or_si512(
      _mm512_and_si512(_mm512_srli_epi16(low, 4 * (j % 4 / 2)), _mm512_set1_epi8(15)),
      _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(pairs, SPREAD16(s, s, s + 2, s + 2)), 4),
                       _mm512_set1_epi8(0x30)));
#else
  const __m512i q = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(weight + ((long)n * KB + b) * 16)));
  __m512i c = _mm512_and_si512(_mm512_srlv_epi16(_mm512_shuffle_i64x2(q, q, 0x50),  // 128-bit lanes: b, b, b+1, b+1
                                                 SPREAD16(0, 4, 0, 4)),  // their low nibbles, high ones, ...
                               _mm512_set1_epi8(15));
#if defined(WEIGHT_Q5_K)  // the fifth bits of blocks b and b + 1: bits j, j + 1 of the super-block's 32 bytes
  const unsigned j = (unsigned)b % 8;
  const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(
      (const __m256i *)(high + ((unsigned long)n * (KB / 8) + (unsigned)b / 8) * 32)));
  const __m512i shifts = SPREAD16(j, j, j + 1, j + 1);  // 16-bit lanes: b's by j, b + 1's by j + 1
  c = _mm512_or_si512(c, _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(h, shifts), 4), _mm512_set1_epi8(16)));
#endif
  return c;
#endif
}

#if defined(WEIGHT_Q6_K)
typedef __m512i pair_scales_t;  // blocks b and b + 1's half-block scales as 16-bit lanes, 8 each (madd's pairs)
ALWAYS_INLINE pair_scales_t pair_half_scales(WEIGHT_PARAMS, int n, int b) {
  int four;
  __builtin_memcpy(&four, scales + ((long)n * KB + b) * 2, 4);
  return _mm512_permutexvar_epi16(SPREAD16(0, 1, 2, 3),
                                  _mm512_castsi128_si512(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(four))));
}
#else
typedef int pair_scales_t;
#endif

// the 16 int32 lanes of blocks b and b + 1 (codes c) against the activation codes x[64]: lanes 0-7 b's, 8-15 b + 1's
ALWAYS_INLINE i32x16 pair_dot(__m512i c, const signed char *restrict x, pair_scales_t scales) {
  const __m512i xv = _mm512_loadu_si512(x);
#if defined(WEIGHT_Q6_K)
  return (i32x16)_mm512_madd_epi16(_mm512_maddubs_epi16(c, xv), scales);
#else
  (void)scales;
  return (i32x16)_mm512_dpbusd_epi32(_mm512_setzero_si512(), c, xv);
#endif
}

// lane i of the result = the sum of block i's 8 lanes, where v[p] holds block 2p's in lanes 0-7 and 2p + 1's in
// 8-15 (integers: any order gives the same sum)
ALWAYS_INLINE i32x8 sums_of_pairs(const i32x16 *v) {
  i32x16 w[2];
  for (int i = 0; i < 2; i++)  // block 4i + k's 4 partial sums in lanes 4k .. 4k + 3
    w[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(v[2 * i], v[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const i32x16 u =  // block k's 2 in lanes 2k, 2k + 1
      __builtin_shufflevector(w[0], w[1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
      __builtin_shufflevector(w[0], w[1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(u, u, 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(u, u, 1, 3, 5, 7, 9, 11, 13, 15);
}
#endif

// lane b of the result = the sum of v[b]'s 8 lanes (integers: any order gives the same sum)
#define PAIRS(x, y, ...) (__builtin_shufflevector(x, y, __VA_ARGS__))
ALWAYS_INLINE i32x8 sums_of_8(const i32x8 *v) {
  i32x8 w[4], u[2];
  for (int i = 0; i < 4; i++)
    w[i] = PAIRS(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) + PAIRS(v[2 * i], v[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int i = 0; i < 2; i++)  // [v4i x2, v4i+2 x2, v4i+1 x2, v4i+3 x2]
    u[i] = PAIRS(w[2 * i], w[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) + PAIRS(w[2 * i], w[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  return PAIRS(u[0], u[1], 0, 4, 2, 6, 8, 12, 10, 14) + PAIRS(u[0], u[1], 1, 5, 3, 7, 9, 13, 11, 15);
}

// the scales (and minimums) of row n's blocks b0 .. b0 + nb - 1 as 8 lanes, zeros after
ALWAYS_INLINE void block_scales8(WEIGHT_PARAMS, int n, int b0, int nb, f32x8 *wd, f32x8 *wm) {
#if defined(WEIGHT_K_SCALES)  // nb = 8 and one super-block: K-quant rows are whole super-blocks of 8 blocks
  const u8x16 c = *(const u8x16 *)(codes + ((long)n * KB + b0) * 2);  // scale, minimum, scale, ...
  const float *super = dm + ((long)n * KB + b0) / 8 * 2;
  *wd = __builtin_convertvector(__builtin_shufflevector(c, c, 0, 2, 4, 6, 8, 10, 12, 14), f32x8) * super[0];
  *wm = -(__builtin_convertvector(__builtin_shufflevector(c, c, 1, 3, 5, 7, 9, 11, 13, 15), f32x8) * super[1]);
#elif defined(WEIGHT_HALF_SCALES)  // the one super-block's d (Q2_K: and -dmin) for its 8 blocks
  *wd = (f32x8){0} + block_scale(WEIGHT_ARGS, (long)n * KB + b0);
#if defined(WEIGHT_Q2_K)
  *wm = (f32x8){0} + block_min(WEIGHT_ARGS, (long)n * KB + b0);
#endif
#else
  *wd = scales8(d + (long)n * KB + b0, nb);
#if defined(WEIGHT_Q4_0)
  *wm = *wd * -8.0f;
#elif defined(WEIGHT_Q4_1)
  *wm = scales8(m + (long)n * KB + b0, nb);
#endif
#endif
}

#if defined(UNSIGNED_CODES)
// lane i: CODE_OFFSET x (block b0 + i's half sums of x times their scales), what the unsigned codes' products hold
// above the signed ones'
ALWAYS_INLINE i32x8 code_offsets(WEIGHT_PARAMS, int n, int b0, const short *restrict x_half_sums) {
  const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(scales + ((long)n * KB + b0) * 2)));
  return (i32x8)_mm256_madd_epi16(sc, _mm256_loadu_si256((const __m256i *)(x_half_sums + b0 * 2))) * CODE_OFFSET;
}
#endif
#if defined(WEIGHT_Q2_K)
// lane i: block b0 + i's half sums of x times their minimum codes (an exact integer, what -dmin multiplies)
ALWAYS_INLINE i32x8 half_min_sums(WEIGHT_PARAMS, int n, int b0, const short *restrict x_half_sums) {
#if defined(__AVX2__)
  const __m128i mins = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(codes + ((long)n * KB + b0) * 2)), 4),
                                     _mm_set1_epi8(15));
  return (i32x8)_mm256_madd_epi16(_mm256_cvtepu8_epi16(mins), _mm256_loadu_si256((const __m256i *)(x_half_sums + b0 * 2)));
#else
  i32x8 sums;
  for (int i = 0; i < 8; i++)
    sums[i] = block_half_min(WEIGHT_ARGS, (long)n * KB + b0 + i, 0) * x_half_sums[(b0 + i) * 2] +
              block_half_min(WEIGHT_ARGS, (long)n * KB + b0 + i, 1) * x_half_sums[(b0 + i) * 2 + 1];
  return sums;
#endif
}
#endif

void matvec_i8(float *restrict out, const float *restrict h, WEIGHT_PARAMS, int core_id) {
  signed char xq[ROWS][K];
  float xd[ROWS][KB];
  float xm[ROWS][KB];
#if defined(X_HALF_SUMS)
  short x_half_sums[ROWS][KB * 2];
  for (int t = 0; t < ROWS; t++) quantize_row(h + (long)t * K, xq[t], xd[t], xm[t], x_half_sums[t]);
#else
  for (int t = 0; t < ROWS; t++) quantize_row(h + (long)t * K, xq[t], xd[t], xm[t], 0);
#endif
  const int n_end = (core_id + 1) * PER_CORE < COLS ? (core_id + 1) * PER_CORE : COLS;
  for (int n = core_id * PER_CORE; n < n_end; n++) {
    if (n + PREFETCH_AHEAD < n_end) prefetch_row(WEIGHT_ARGS, n + PREFETCH_AHEAD);
    f32x8 acc[ROWS];
    for (int t = 0; t < ROWS; t++) acc[t] = (f32x8){0};
    for (int b0 = 0; b0 < KB; b0 += 8) {
      const int nb = KB - b0 < 8 ? KB - b0 : 8;
      i32x8 sums[ROWS];
#if defined(PAIRED_BLOCKS)
      i32x16 pair_dots[ROWS][4];
#pragma unroll
      for (int p = 0; p < 4; p++) {
        const __m512i c = load_block_pair(WEIGHT_ARGS, n, b0 + 2 * p);
#if defined(WEIGHT_Q6_K)
        const pair_scales_t ps = pair_half_scales(WEIGHT_ARGS, n, b0 + 2 * p);
#else
        const pair_scales_t ps = 0;
#endif
        for (int t = 0; t < ROWS; t++) pair_dots[t][p] = pair_dot(c, xq[t] + (b0 + 2 * p) * 32, ps);
      }
      for (int t = 0; t < ROWS; t++) {
        sums[t] = sums_of_pairs(pair_dots[t]);
#if defined(UNSIGNED_CODES)
        sums[t] -= code_offsets(WEIGHT_ARGS, n, b0, x_half_sums[t]);
#endif
      }
#else
      i32x8 dots[ROWS][8];
#pragma unroll  // i a constant in each copy: the K-quants' bit fields come out by shifts of fixed counts
      for (int i = 0; i < 8; i++) {
        if (i < nb) {
          const block_t blk = load_block(WEIGHT_ARGS, n, b0 + i);
#if defined(WEIGHT_HALF_SCALES)
          const half_scales_t hs = half_scales(WEIGHT_ARGS, n, b0, i);
#else
          const half_scales_t hs = {0};
#endif
          for (int t = 0; t < ROWS; t++) dots[t][i] = block_dot(blk, xq[t] + (b0 + i) * 32, hs);
        } else {
          for (int t = 0; t < ROWS; t++) dots[t][i] = (i32x8){0};
        }
      }
      for (int t = 0; t < ROWS; t++) {
#if defined(UNSIGNED_CODES)
        sums[t] = sums_of_8(dots[t]) - code_offsets(WEIGHT_ARGS, n, b0, x_half_sums[t]);
#else
        sums[t] = sums_of_8(dots[t]);
#endif
      }
#endif
      f32x8 wd, wm;
      block_scales8(WEIGHT_ARGS, n, b0, nb, &wd, &wm);
      for (int t = 0; t < ROWS; t++) {
        acc[t] += __builtin_convertvector(sums[t], f32x8) * (wd * load8(xd[t] + b0, nb));
#if defined(WEIGHT_NIBBLES)
        acc[t] += wm * load8(xm[t] + b0, nb);
#elif defined(WEIGHT_Q2_K)
        acc[t] += __builtin_convertvector(half_min_sums(WEIGHT_ARGS, n, b0, x_half_sums[t]), f32x8) * (wm * load8(xd[t] + b0, nb));
#endif
      }
    }
    for (int t = 0; t < ROWS; t++) out[(long)t * COLS + n] = LANE_SUM8(acc[t]);
  }
}
