// out[ROWS, COLS] = h[ROWS, K] @ weight.T for a few rows and a Q4_0, Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or Q8_0 weight, with h
// quantised to int8 per 32-element block and each block's products summed as integers: 4 multiplies per instruction
// lane (VNNI's vpdpbusd, AVX2's vpmaddubsw + vpmaddwd, NEON's sdot), where the float32 kernel (matvec.c) widens every weight
// to a float first (EXPERTS: each row of h times its own expert's COLS rows, as in matvec.c). Core core_id of CORES
// computes its share of the columns; each core quantises h itself
// (ROWS x K, small next to the weight it reads). The arithmetic is int8_rows.h's, as gemm_i8.c's for more rows:
// here the 8 float lanes are 8 consecutive blocks of one output; with AVX-512 (BLOCK_LANES) the weight's dwords are
// transposed so each vector lane holds one block, elsewhere each block's integer sums are reduced by a
// transpose-and-add tree.
#include "kernel.h"
#include "weights.h"
#include "int8_products.h"

#define PREFETCH_AHEAD 4
#if (defined(__AVX512VNNI__) && defined(__AVX512BW__) && (defined(WEIGHT_NIBBLES) || defined(WEIGHT_Q8_0)) && KB % 8 == 0) || \
    (defined(__AVX512BW__) && defined(WEIGHT_Q6_K))
// Two columns' 8 blocks at a time (the nibble kinds' and Q8_0's vpdpbusd, Q8_0's codes + 128 as unsigned bytes and
// 128 x the activations' code sums taken off; Q6_K's unsigned codes in vpmaddubsw + vpmaddwd with its half-block
// scales), transposed in registers once for every row (load_group: the nibble kinds' raw bytes in 8 shuffles, Q6_K's
// unpacked codes and Q8_0's in 24), so that a vector holds dword k of all 16 (column, block) pairs and a row's 8
// products leave each block's sum in a lane of its own:
// no reduction tree per row (it had cost 12 shuffles and adds per row and 8 blocks), and one float epilogue covers
// 16 blocks. The activations are laid out once per call in the lanes' order. (benchmarks/cpu_kernels.py, 2048 x 2048
// from L3, 1 / 4 / 8 rows, us: Q4_K 87 / 200 / 393 with a tree per column and row -> 76 / 110 / 200; Q4_0 86 / 197 /
// 380 -> 70 / 111 / 219; Q6_K 98 / 210 / 400 -> 110 / 189 / 288)
#define BLOCK_LANES 1
#endif
#if defined(CODE_OFFSET) && defined(__AVX2__)
// Q6_K's and Q3_K's codes multiplied as they are stored, 0..63 and 0..7 (unsigned, as maddubs takes them: no sign
// instructions), and the CODE_OFFSET (32, 4) taken once per 8 blocks from the activations' 16-element sums:
// sum (c - 32) x = sum c x - 32 sum x
#define UNSIGNED_CODES 1
#endif
#if defined(UNSIGNED_CODES) || defined(WEIGHT_Q2_K) || (defined(BLOCK_LANES) && defined(WEIGHT_Q8_0))
#define X_HALF_SUMS 1  // the activations' 16-element code sums (Q6_K's and Q3_K's offsets, Q2_K's minimums, Q8_0's
                       // offset codes take them)
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

#if defined(BLOCK_LANES)
#if defined(WEIGHT_Q6_K)
#define SPREAD16(a, b, c, d) _mm512_set_epi64((d) * 0x0001000100010001LL, (d) * 0x0001000100010001LL, \
  (c) * 0x0001000100010001LL, (c) * 0x0001000100010001LL, (b) * 0x0001000100010001LL, (b) * 0x0001000100010001LL, \
  (a) * 0x0001000100010001LL, (a) * 0x0001000100010001LL)  // 16-bit lanes 0-7 a, 8-15 b, 16-23 c, 24-31 d
// weight row n's blocks b and b + 1 (b even) as 64 codes 0..63, each block's 32 elements in order: b and b + 1's low
// nibbles are the 64 bytes of their half, their high bit pairs the same 32
ALWAYS_INLINE __m512i load_block_pair(WEIGHT_PARAMS, int n, int b) {
  const unsigned j = (unsigned)b % 8;
  const unsigned long super = (unsigned long)n * (KB / 8) + (unsigned)b / 8;
  const __m512i low = _mm512_loadu_si512(weight + super * 128 + j / 4 * 64);
  const __m512i pairs = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(high + super * 64 + j / 4 * 32)));
  const unsigned s = 2 * (j % 4);  // b's pair in bits s, s + 1; b + 1's in s + 2, s + 3
  return _mm512_or_si512(
      _mm512_and_si512(_mm512_srli_epi16(low, 4 * (j % 4 / 2)), _mm512_set1_epi8(15)),
      _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(pairs, SPREAD16(s, s, s + 2, s + 2)), 4),
                       _mm512_set1_epi8(0x30)));
}
#endif

#if defined(WEIGHT_NIBBLES)
// the nibble kinds: the two columns' 16 blocks' raw 16 bytes (4 zmm loads) transposed as 16 rows of 4 dwords (8
// shuffles), then each dword's low nibbles are the block's dword k and its high ones dword k + 4: column c's block
// b = 4 b2 + 2 b1 + b0 in lane 8 b1 + 4 b0 + 2 c + b2
#define LANE_OF(c, b) (8 * (((b) >> 1) & 1) + 4 * ((b) & 1) + 2 * (c) + ((b) >> 2))
#define LANE_ROW(L) (8 * (((L) >> 1) & 1) + 4 * ((L) & 1) + 2 * (((L) >> 3) & 1) + (((L) >> 2) & 1))
#else
// Q6_K and Q8_0: 8 pairs of blocks' codes (Q6_K's unpacked by load_block_pair) transposed as 16 rows of 8 dwords:
// column c's block b in lane ROW_LANE(8 c + b)
#define LANE_OF(c, b) ROW_LANE(8 * (c) + (b))
#define LANE_ROW(L) (2 * ((L) % 8) + (L) / 8)
#endif
#define LANE_BLOCK(L) (LANE_ROW(L) % 8)  // lane L holds column LANE_ROW(L) / 8's block LANE_BLOCK(L)
// columns n's and n1's 8 values (a block's scale or minimum) in the lanes' order
#define IN_LANES(v0, v1) __builtin_shufflevector(v0, v1, LANE_ROW(0), LANE_ROW(1), LANE_ROW(2), LANE_ROW(3), LANE_ROW(4), \
  LANE_ROW(5), LANE_ROW(6), LANE_ROW(7), LANE_ROW(8), LANE_ROW(9), LANE_ROW(10), LANE_ROW(11), LANE_ROW(12), LANE_ROW(13), \
  LANE_ROW(14), LANE_ROW(15))
// column c's 8 lanes, block 0 to 7 (acc: a group's lanes)
#define COLUMN_LANES(acc, c) __builtin_shufflevector(acc, acc, LANE_OF(c, 0), LANE_OF(c, 1), LANE_OF(c, 2), LANE_OF(c, 3), \
  LANE_OF(c, 4), LANE_OF(c, 5), LANE_OF(c, 6), LANE_OF(c, 7))

// columns n, n1's 8 blocks from b0 (a multiple of 8) as 8 vectors: w[k] lane L = dword k of its (column, block)
ALWAYS_INLINE void load_group(WEIGHT_PARAMS, int n, int n1, int b0, i32x16 *restrict w) {
#if defined(WEIGHT_NIBBLES)
  i32x16 raw[4];  // raw[2 c + h]: column c's blocks 4 h .. 4 h + 3, lane 4 (b % 4) + j = the block's byte dword j
  for (int i = 0; i < 4; i++) raw[i] = *(const s32x16 *)(weight + ((long)(i < 2 ? n : n1) * KB + b0 + 4 * (i % 2)) * 16);
  transpose_rows(raw, 2);
  for (int j = 0; j < 4; j++) w[j] = raw[j] & 0x0f0f0f0f, w[j + 4] = (raw[j] >> 4) & 0x0f0f0f0f;
#if defined(WEIGHT_Q5_K)  // element e's fifth bit: bit b of the super-block's byte e
  const int *h0 = (const int *)(high + ((unsigned long)n * (KB / 8) + (unsigned)b0 / 8) * 32);
  const int *h1 = (const int *)(high + ((unsigned long)n1 * (KB / 8) + (unsigned)b0 / 8) * 32);
  const u32x16 shift = {LANE_BLOCK(0), LANE_BLOCK(1), LANE_BLOCK(2), LANE_BLOCK(3), LANE_BLOCK(4), LANE_BLOCK(5),
                        LANE_BLOCK(6), LANE_BLOCK(7), LANE_BLOCK(8), LANE_BLOCK(9), LANE_BLOCK(10), LANE_BLOCK(11),
                        LANE_BLOCK(12), LANE_BLOCK(13), LANE_BLOCK(14), LANE_BLOCK(15)};
  unsigned short column1 = 0;  // the lanes of column n1
  for (int L = 0; L < 16; L++) column1 |= (unsigned short)((LANE_ROW(L) / 8) << L);
  for (int k = 0; k < 8; k++) {  // dword k of each lane's column, its bit b of every byte moved to bit 4
    const u32x16 bits = (u32x16)_mm512_mask_blend_epi32(column1, _mm512_set1_epi32(h0[k]), _mm512_set1_epi32(h1[k]));
    w[k] |= (i32x16)(((bits >> shift) << 4) & 0x10101010u);
  }
#endif
#elif defined(WEIGHT_Q8_0)  // blocks 2p, 2p + 1's 64 code bytes as they are stored, + 128
  for (int p = 0; p < 8; p++)
    w[p] = *(const s32x16 *)(weight + ((long)(p < 4 ? n : n1) * KB + b0 + 2 * (p % 4)) * 32) ^ (int)0x80808080u;
  transpose_rows(w, 3);
#else
#pragma unroll
  for (int p = 0; p < 4; p++)
    w[p] = (i32x16)load_block_pair(WEIGHT_ARGS, n, b0 + 2 * p), w[4 + p] = (i32x16)load_block_pair(WEIGHT_ARGS, n1, b0 + 2 * p);
  transpose_rows(w, 3);
#endif
}

#if defined(WEIGHT_Q6_K)
// the permutation of 16-bit lanes that puts the 2 x 16 half-block scales (column c's block b's half h at 16 c + 2 b + h)
// where a group's lanes want them: half h's scale in both halves of each lane (h 0, 1: what madd multiplies dwords
// 0-3 or 4-7 by), or both halves' scales side by side (h 2: what multiplies the activations' half sums)
ALWAYS_INLINE __m512i half_scale_index(int h) {
  short index[32];
  for (int j = 0; j < 32; j++) index[j] = (short)(2 * LANE_ROW(j / 2) + (h == 2 ? j % 2 : h));
  return _mm512_loadu_si512(index);
}

// columns n, n1's half-block scales of blocks b0 .. b0 + 7 as 16-bit lanes in the order index (half_scale_index) says
ALWAYS_INLINE __m512i group_half_scales(WEIGHT_PARAMS, int n, int n1, int b0, __m512i index) {
  const __m128i s0 = _mm_loadu_si128((const __m128i *)(scales + ((long)n * KB + b0) * 2));
  const __m128i s1 = _mm_loadu_si128((const __m128i *)(scales + ((long)n1 * KB + b0) * 2));
  return _mm512_permutexvar_epi16(index, _mm512_cvtepi8_epi16(_mm256_set_m128i(s1, s0)));
}
#endif
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

#if defined(EXPERTS)
#define GROUP_ROWS 8  // an expert's rows multiplied together (4: a Qwen3-30B-A3B-shaped prompt 6% slower)
#define MAX_PASS_ROWS GROUP_ROWS
#else
#define MAX_PASS_ROWS ROWS
#endif
// out_rows[t][0 .. COLS) = h_rows[t] @ (weight rows base .. base + COLS - 1).T for t < rows (a constant where it is
// inlined: each row count its own unrolled copy)
ALWAYS_INLINE void rows_product(float *const *out_rows, const float *const *h_rows, const int rows, WEIGHT_PARAMS,
                                int core_id, long base) {
  signed char xq[MAX_PASS_ROWS][K] __attribute__((aligned(4)));
  float xd[MAX_PASS_ROWS][KB];
  float xm[MAX_PASS_ROWS][KB];
#if defined(X_HALF_SUMS)
  short x_half_sums[MAX_PASS_ROWS][KB * 2];
  for (int t = 0; t < rows; t++) quantize_row(h_rows[t], xq[t], xd[t], xm[t], x_half_sums[t]);
#else
  for (int t = 0; t < rows; t++) quantize_row(h_rows[t], xq[t], xd[t], xm[t], 0);
#endif
  const int n_end = (core_id + 1) * PER_CORE < COLS ? (core_id + 1) * PER_CORE : COLS;
#if defined(BLOCK_LANES)
  // the activations in the groups' lane order: xt[t][g][k] lane L = dword k of row t's block 8 g + LANE_BLOCK(L)
  i32x16 xt[MAX_PASS_ROWS][KB / 8][8];
  f32x16 xdt[MAX_PASS_ROWS][KB / 8];
#if defined(WEIGHT_NIBBLES)
  f32x16 xmt[MAX_PASS_ROWS][KB / 8];  // what the weights' minimums multiply
#endif
#if defined(WEIGHT_Q8_0)
  i32x16 xo[MAX_PASS_ROWS][KB / 8];  // -128 x the block's code sum: what the weights' + 128 added
#endif
#if defined(WEIGHT_Q6_K)
  i32x16 xht[MAX_PASS_ROWS][KB / 8];  // 16-bit lanes 2L, 2L + 1: the block's halves' code sums
  const __m512i scale_index[3] = {half_scale_index(0), half_scale_index(1), half_scale_index(2)};
#endif
  for (int t = 0; t < rows; t++)
    for (int g = 0; g < KB / 8; g++)
      for (int L = 0; L < 16; L++) {
        const int b = 8 * g + LANE_BLOCK(L);
        for (int k = 0; k < 8; k++) xt[t][g][k][L] = ((const int *)xq[t])[b * 8 + k];
        xdt[t][g][L] = xd[t][b];
#if defined(WEIGHT_NIBBLES)
        xmt[t][g][L] = xm[t][b];
#endif
#if defined(WEIGHT_Q8_0)
        xo[t][g][L] = -128 * (x_half_sums[t][2 * b] + x_half_sums[t][2 * b + 1]);
#endif
#if defined(WEIGHT_Q6_K)
        xht[t][g][L] = (unsigned short)x_half_sums[t][2 * b] | (int)((unsigned)(unsigned short)x_half_sums[t][2 * b + 1] << 16);
#endif
      }
  // two columns at a time (KB % 8 == 0 here), each block in a lane of its own: each lane's float operations are the
  // one-column loop's below, so the bits are the same
  for (int n = core_id * PER_CORE; n < n_end; n += 2) {
    const int n1 = n + 1 < n_end ? n + 1 : n;  // an odd last column is computed twice and stored once
    f32x16 acc[MAX_PASS_ROWS];
    for (int t = 0; t < rows; t++) acc[t] = (f32x16){0};
    for (int g = 0; g < KB / 8; g++) {
      i32x16 w[8];
      for (int i = 0; i < 2; i++)  // the same blocks of the rows PREFETCH_AHEAD on
        if (n + PREFETCH_AHEAD + i < n_end) prefetch_blocks(WEIGHT_ARGS, base + n + PREFETCH_AHEAD + i, 8 * g, 8);
      load_group(WEIGHT_ARGS, base + n, base + n1, 8 * g, w);
      f32x8 wd0, wm0, wd1, wm1;
      block_scales8(WEIGHT_ARGS, base + n, 8 * g, 8, &wd0, &wm0);
      block_scales8(WEIGHT_ARGS, base + n1, 8 * g, 8, &wd1, &wm1);
      const f32x16 wd = IN_LANES(wd0, wd1);
#if defined(WEIGHT_NIBBLES)
      const f32x16 wm = IN_LANES(wm0, wm1);
#endif
#if defined(WEIGHT_Q6_K)
      const __m512i half_scale[2] = {group_half_scales(WEIGHT_ARGS, base + n, base + n1, 8 * g, scale_index[0]),
                                     group_half_scales(WEIGHT_ARGS, base + n, base + n1, 8 * g, scale_index[1])};
      const __m512i both_scales = group_half_scales(WEIGHT_ARGS, base + n, base + n1, 8 * g, scale_index[2]);
#endif
      for (int t = 0; t < rows; t++) {
#if defined(WEIGHT_Q8_0)
        i32x16 sums = xo[t][g];
#else
        i32x16 sums = {0};
#endif
        for (int k = 0; k < 8; k++) {
#if defined(WEIGHT_Q6_K)
          const __m512i pairs = _mm512_maddubs_epi16((__m512i)w[k], (__m512i)xt[t][g][k]);
#if defined(__AVX512VNNI__)
          sums = (i32x16)_mm512_dpwssd_epi32((__m512i)sums, pairs, half_scale[k / 4]);
#else
          sums += (i32x16)_mm512_madd_epi16(pairs, half_scale[k / 4]);
#endif
#else
          sums = (i32x16)_mm512_dpbusd_epi32((__m512i)sums, (__m512i)w[k], (__m512i)xt[t][g][k]);
#endif
        }
#if defined(WEIGHT_Q6_K)
        sums -= (i32x16)_mm512_madd_epi16(both_scales, (__m512i)xht[t][g]) * CODE_OFFSET;
#endif
        acc[t] += __builtin_convertvector(sums, f32x16) * (wd * xdt[t][g]);
#if defined(WEIGHT_NIBBLES)
        acc[t] += wm * xmt[t][g];
#endif
      }
    }
    for (int t = 0; t < rows; t++) {
      const f32x8 lanes0 = COLUMN_LANES(acc[t], 0), lanes1 = COLUMN_LANES(acc[t], 1);
      out_rows[t][n] = LANE_SUM8(lanes0);
      if (n1 != n) out_rows[t][n1] = LANE_SUM8(lanes1);
    }
  }
#else
  for (int n = core_id * PER_CORE; n < n_end; n++) {
    if (n + PREFETCH_AHEAD < n_end) prefetch_row(WEIGHT_ARGS, base + n + PREFETCH_AHEAD);
    f32x8 acc[MAX_PASS_ROWS];
    for (int t = 0; t < rows; t++) acc[t] = (f32x8){0};
    for (int b0 = 0; b0 < KB; b0 += 8) {
      const int nb = KB - b0 < 8 ? KB - b0 : 8;
      i32x8 sums[MAX_PASS_ROWS];
      i32x8 dots[MAX_PASS_ROWS][8];
#pragma unroll  // i a constant in each copy: the K-quants' bit fields come out by shifts of fixed counts
      for (int i = 0; i < 8; i++) {
        if (i < nb) {
          const block_t blk = load_block(WEIGHT_ARGS, base + n, b0 + i);
#if defined(WEIGHT_HALF_SCALES)
          const half_scales_t hs = half_scales(WEIGHT_ARGS, base + n, b0, i);
#else
          const half_scales_t hs = {0};
#endif
          for (int t = 0; t < rows; t++) dots[t][i] = block_dot(blk, xq[t] + (b0 + i) * 32, hs);
        } else {
          for (int t = 0; t < rows; t++) dots[t][i] = (i32x8){0};
        }
      }
      for (int t = 0; t < rows; t++) {
#if defined(UNSIGNED_CODES)
        sums[t] = sums_of_8(dots[t]) - code_offsets(WEIGHT_ARGS, base + n, b0, x_half_sums[t]);
#else
        sums[t] = sums_of_8(dots[t]);
#endif
      }
      f32x8 wd, wm;
      block_scales8(WEIGHT_ARGS, base + n, b0, nb, &wd, &wm);
      for (int t = 0; t < rows; t++) {
        acc[t] += __builtin_convertvector(sums[t], f32x8) * (wd * load8(xd[t] + b0, nb));
#if defined(WEIGHT_NIBBLES)
        acc[t] += wm * load8(xm[t] + b0, nb);
#elif defined(WEIGHT_Q2_K)
        const i32x8 min_sums = half_min_sums(WEIGHT_ARGS, base + n, b0, x_half_sums[t]);
        acc[t] += __builtin_convertvector(min_sums, f32x8) * (wm * load8(xd[t] + b0, nb));
#endif
      }
    }
    for (int t = 0; t < rows; t++) out_rows[t][n] = LANE_SUM8(acc[t]);
  }
#endif
}

#if defined(EXPERTS)
// Mixture-of-experts products: row t of h times the COLS weight rows of expert experts[t] (rows experts[t] x COLS on
// of a weight holding N_EXPERTS experts' rows one after another). The rows are grouped by expert (a counting sort) and
// each expert's rows go GROUP_ROWS at a time: a prompt's tokens routed to one expert read it once per GROUP_ROWS of
// them, a decode's rows (rarely two on one expert) one by one. Every row's arithmetic is the plain kernel's.
#define PASS(n) case n: rows_product(outs, hs, n, WEIGHT_ARGS, core_id, base); break;
void matvec_i8(float *restrict out, const float *restrict h, const int *restrict experts, WEIGHT_PARAMS, int core_id) {
  int start[N_EXPERTS + 1], fill[N_EXPERTS], order[ROWS];
  for (int e = 0; e <= N_EXPERTS; e++) start[e] = 0;
  for (int t = 0; t < ROWS; t++) start[(unsigned)experts[t] < N_EXPERTS ? experts[t] + 1 : 1]++;  // (bad ids: expert 0)
  for (int e = 0; e < N_EXPERTS; e++) start[e + 1] += start[e], fill[e] = start[e];
  for (int t = 0; t < ROWS; t++) order[fill[(unsigned)experts[t] < N_EXPERTS ? experts[t] : 0]++] = t;
  for (int e = 0; e < N_EXPERTS; e++)
    for (int i = start[e]; i < start[e + 1]; i += GROUP_ROWS) {
      const int rows = start[e + 1] - i < GROUP_ROWS ? start[e + 1] - i : GROUP_ROWS;
      const long base = (long)e * COLS;
      float *outs[GROUP_ROWS];
      const float *hs[GROUP_ROWS];
      for (int j = 0; j < rows; j++) outs[j] = out + (long)order[i + j] * COLS, hs[j] = h + (long)order[i + j] * K;
      switch (rows) { PASS(1) PASS(2) PASS(3) PASS(4) PASS(5) PASS(6) PASS(7) PASS(8) }
    }
}
#else
void matvec_i8(float *restrict out, const float *restrict h, WEIGHT_PARAMS, int core_id) {
  float *outs[ROWS];
  const float *hs[ROWS];
  for (int t = 0; t < ROWS; t++) outs[t] = out + (long)t * COLS, hs[t] = h + (long)t * K;
  rows_product(outs, hs, ROWS, WEIGHT_ARGS, core_id, 0);
}
#endif
