// out[ROWS, COLS] = h[ROWS, K] @ weight.T for a few rows and a Q4_1 or Q8_0 weight, with h quantised to int8 per
// 32-element block (scale = max |x| / 127, as llama.cpp's Q8_0/Q8_1 activations) and each block's products summed
// as integers: 4 multiplies per instruction lane (VNNI's vpdpbusd, AVX2's vpmaddubsw + vpmaddwd, NEON's sdot),
// where the float32 kernel (matvec.c) widens every weight to a float first. Core core_id of CORES computes its
// share of the columns; each core quantises h itself (ROWS x K, small next to the weight it reads).
//
// The arithmetic is fixed so that tests/workers/int8_matvec_model.py's numpy model gives the same bits on every
// target: per block, 8 int32 lanes, lane j the sum of the products of elements 4j..4j+3; per output, 8 float
// lanes acc[j] += (float)lane_j * (d_w * d_x), and for Q4_1 a scalar sum of m_w * (d_x * (float)(the block's
// int8 codes summed)); out = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + that sum. No reassociation, no
// contraction into fused multiply-adds.
#include "kernel.h"
#include "weights.h"

#pragma clang fp contract(off)
#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#endif
#if !defined(WEIGHT_Q4_1) && !defined(WEIGHT_Q8_0)
#error "int8 activations are for Q4_1 and Q8_0 weights"
#endif
#define PER_CORE ((COLS + CORES - 1) / CORES)
#define PREFETCH_AHEAD 4

typedef int i32x8 __attribute__((vector_size(32), aligned(4)));
typedef float f32x8 __attribute__((vector_size(32), aligned(4)));

// x[K] as int8 codes xq and per block a scale xd and xm = xd * (the codes' sum), what a Q4_1 minimum multiplies;
// code = (int)(x * (1 / scale) +- 0.5) in float32. A block with a NaN or an infinity gets codes 0 and scale NaN
// (its outputs turn NaN, as the float kernel's would); one too small for 1 / scale to be finite, codes 0.
ALWAYS_INLINE void quantize_row(const float *restrict x, signed char *restrict xq, float *restrict xd, float *restrict xm) {
  for (int b = 0; b < KB; b++) {
    float amax = 0.0f;
    for (int e = 0; e < 32; e++) {
      const float a = x[b * 32 + e] < 0.0f ? -x[b * 32 + e] : x[b * 32 + e];
      amax = a > amax || a != a ? a : amax;  // a NaN stays
    }
    const int finite = amax <= 3.40282347e38f;  // false for NaN and infinity
    const float d = finite ? amax / 127.0f : __builtin_nanf("");
    float id = finite && d != 0.0f ? 1.0f / d : 0.0f;
    id = id <= 3.40282347e38f ? id : 0.0f;
    int sum = 0;
    for (int e = 0; e < 32; e++) {
      const float v = x[b * 32 + e] * id;
      const int q = finite ? (int)(v + (v >= 0.0f ? 0.5f : -0.5f)) : 0;
      xq[b * 32 + e] = (signed char)q;
      sum += q;
    }
    xd[b] = d;
    xm[b] = d * (float)sum;
  }
}

// weight row n's block b as the instructions take it (loaded and unpacked once for every activation row)
#if defined(__AVX2__)
typedef struct { __m256i u, w; } block_t;  // u: the unsigned factor (Q4_1's nibbles, Q8_0's |w|); w: Q8_0's signs
#elif defined(__ARM_FEATURE_DOTPROD)
typedef struct { int8x16_t w0, w1; } block_t;
#else
typedef struct { signed char w[32]; } block_t;
#endif

ALWAYS_INLINE block_t load_block(WEIGHT_PARAMS, int n, int b) {
  block_t blk;
#if defined(WEIGHT_Q4_1)
  const unsigned char *q = weight + ((long)n * KB + b) * 16;  // byte i: element i (low nibble), i + 16 (high)
#else
  const signed char *q = weight + ((long)n * KB + b) * 32;
#endif
#if defined(__AVX2__) && defined(WEIGHT_Q4_1)
  const __m128i packed = _mm_loadu_si128((const __m128i *)q), low = _mm_set1_epi8(15);
  blk.u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
  blk.w = blk.u;
#elif defined(__AVX2__)  // unsigned |w| times x with w's sign: the u8 x s8 products the instructions take
  blk.w = _mm256_loadu_si256((const __m256i *)q);
  blk.u = _mm256_sign_epi8(blk.w, blk.w);
#elif defined(__ARM_FEATURE_DOTPROD) && defined(WEIGHT_Q4_1)
  const uint8x16_t packed = vld1q_u8(q);
  blk.w0 = vreinterpretq_s8_u8(vandq_u8(packed, vdupq_n_u8(15)));
  blk.w1 = vreinterpretq_s8_u8(vshrq_n_u8(packed, 4));
#elif defined(__ARM_FEATURE_DOTPROD)
  blk.w0 = vld1q_s8(q), blk.w1 = vld1q_s8(q + 16);
#else
  for (int e = 0; e < 32; e++) {
#if defined(WEIGHT_Q4_1)
    blk.w[e] = (signed char)(e < 16 ? q[e] & 15 : q[e - 16] >> 4);
#else
    blk.w[e] = q[e];
#endif
  }
#endif
  return blk;
}

// the block's 8 int32 lanes against the activation codes x[32] (see the top)
ALWAYS_INLINE i32x8 block_dot(block_t blk, const signed char *restrict x) {
#if defined(__AVX2__)
  const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
#if defined(WEIGHT_Q4_1)
  const __m256i s = xv;
#else
  const __m256i s = _mm256_sign_epi8(xv, blk.w);
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return (i32x8)_mm256_dpbusd_epi32(_mm256_setzero_si256(), blk.u, s);
#else  // pairs of products fit int16 unsaturated: 15 * 127 * 2 and 128 * 127 * 2 are under 32767
  return (i32x8)_mm256_madd_epi16(_mm256_maddubs_epi16(blk.u, s), _mm256_set1_epi16(1));
#endif
#elif defined(__ARM_FEATURE_DOTPROD)
  const int32x4_t lo = vdotq_s32(vdupq_n_s32(0), blk.w0, vld1q_s8(x));
  const int32x4_t hi = vdotq_s32(vdupq_n_s32(0), blk.w1, vld1q_s8(x + 16));
  return (i32x8){lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]};
#else
  i32x8 lanes = {0};
  for (int e = 0; e < 32; e++) lanes[e / 4] += blk.w[e] * x[e];
  return lanes;
#endif
}

void matvec_i8(float *restrict out, const float *restrict h, WEIGHT_PARAMS, int core_id) {
  signed char xq[ROWS][K];
  float xd[ROWS][KB];
  float xm[ROWS][KB];
  for (int t = 0; t < ROWS; t++) quantize_row(h + (long)t * K, xq[t], xd[t], xm[t]);
  const int n_end = (core_id + 1) * PER_CORE < COLS ? (core_id + 1) * PER_CORE : COLS;
  for (int n = core_id * PER_CORE; n < n_end; n++) {
    if (n + PREFETCH_AHEAD < n_end) prefetch_row(WEIGHT_ARGS, n + PREFETCH_AHEAD);
    f32x8 acc[ROWS];
    float mins[ROWS];
    for (int t = 0; t < ROWS; t++) acc[t] = (f32x8){0}, mins[t] = 0.0f;
    for (int b = 0; b < KB; b++) {
      const float wd = d[(long)n * KB + b];
      const block_t blk = load_block(WEIGHT_ARGS, n, b);
      for (int t = 0; t < ROWS; t++) {
        const f32x8 lanes = __builtin_convertvector(block_dot(blk, xq[t] + b * 32), f32x8);
        acc[t] += lanes * (wd * xd[t][b]);
#if defined(WEIGHT_Q4_1)
        mins[t] += m[(long)n * KB + b] * xm[t][b];
#endif
      }
    }
    for (int t = 0; t < ROWS; t++) {
      const f32x8 a = acc[t];
      out[(long)t * COLS + n] = (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) + mins[t];
    }
  }
}
