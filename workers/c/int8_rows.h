// Shared by the int8-activation kernels (matvec_i8.c, quantize_i8.c + gemm_i8.c): the activations' quantisation,
// the tiles gemm_i8.c reads them in and the sums both products end with, so that at any row count they compute
// tests/workers/int8_matvec_model.py's bits.
// Activations: int8 codes per 32-element block, scale = max |x| / 127 (llama.cpp's Q8_0/Q8_1 activations).
// Per output: 8 float lanes; block b adds (float)(its exact integer dot product) * (d_w * d_x) to lane b % 8,
// then for the nibble kinds (Q4_0, Q4_1, Q4_K, Q5_K) m_w * xm (xm = d_x * the block's code sum), for Q2_K
// (float)(its halves' code sums times their minimum codes) * (m_w * d_x) (m_w = -dmin);
// out = ((L0 + L1) + (L2 + L3)) + ((L4 + L5) + (L6 + L7)).
// No reassociation, no contraction into fused multiply-adds. Needs K and kernel.h.
#pragma clang fp contract(off)
#ifndef KB
#define KB (K / 32)
#endif

typedef int i32x8 __attribute__((vector_size(32), aligned(4)));

// x[K] as int8 codes xq and per block a scale xd and xm = xd * (the codes' sum), what a nibble kind's minimum multiplies
// (and, unless xh is 0, the sums of its elements 0-15's and 16-31's codes in xh[2b], xh[2b + 1]: at most 16 x 127);
// code = (int)(x * (1 / scale) +- 0.5) in float32. A block with a NaN or an infinity gets codes 0 and scale NaN
// (its outputs turn NaN, as the float kernel's would); one too small for 1 / scale to be finite, codes 0.
// max |x| is taken on the bits (integer max vectorises; a NaN's bits exceed an infinity's, which exceed any number's).
ALWAYS_INLINE void quantize_row(const float *restrict x, signed char *restrict xq, float *restrict xd, float *restrict xm,
                                short *restrict xh) {
  for (int b = 0; b < KB; b++) {
    unsigned amax_bits = 0;
    for (int e = 0; e < 32; e++) {
      unsigned a;
      __builtin_memcpy(&a, x + b * 32 + e, 4);
      a &= 0x7fffffffu;
      amax_bits = a > amax_bits ? a : amax_bits;
    }
    int half[2] = {0, 0};
    if (amax_bits < 0x7f800000u) {  // finite
      union { unsigned u; float f; } amax = {amax_bits};
      const float d = amax.f / 127.0f;
      float id = d != 0.0f ? 1.0f / d : 0.0f;
      id = id <= 3.40282347e38f ? id : 0.0f;
      for (int e = 0; e < 32; e++) {
        const float v = x[b * 32 + e] * id;
        const int q = (int)(v + (v >= 0.0f ? 0.5f : -0.5f));
        xq[b * 32 + e] = (signed char)q;
        half[e / 16] += q;
      }
      xd[b] = d;
    } else {
      for (int e = 0; e < 32; e++) xq[b * 32 + e] = 0;
      xd[b] = __builtin_nanf("");
    }
    xm[b] = xd[b] * (float)(half[0] + half[1]);
    if (xh) xh[2 * b] = (short)half[0], xh[2 * b + 1] = (short)half[1];
  }
}

// 4 rows' codes as gemm_i8.c reads them (quantize_i8.c writes them): a 16-lane vector of its register path holds 4
// rows x 4 weight rows, lane 4j + i = row i, so each dword here is one row's 4 codes, the 4 rows side by side (its
// panels broadcast one row's dword)
typedef int i32x4 __attribute__((vector_size(16), aligned(16)));
typedef float f32x4 __attribute__((vector_size(16), aligned(16)));
typedef struct {
  i32x4 codes[KB][8];  // [b][k]: dword k (elements 4k..4k+3) of block b of rows 0-3
  f32x4 d[KB], m[KB];  // the rows' scales, scale x code sum
  i32x4 offset[KB];    // -128 x the rows' code sums (for Q8_0 codes stored + 128)
  i32x4 half_sum[KB][2];  // the rows' sums of elements 0-15 and 16-31's codes (what Q2_K's minimums and Q6_K's
                          // and Q3_K's code offsets multiply)
} tile_t;
#define TILE_BYTES (208 * KB)
_Static_assert(sizeof(tile_t) == TILE_BYTES, "workers/cpu_gemm.py's TILE_BYTES_PER_BLOCK");

// rows r0 .. r0 + 3 of h[rows, K] (zeros past `rows`) as a tile
ALWAYS_INLINE void quantize_tile(const float *restrict h, int rows, int r0, tile_t *restrict tile) {
  for (int i = 0; i < 4; i++) {
    signed char xq[K] __attribute__((aligned(32)));
    float xd[KB], xm[KB];
    short xh[KB * 2];
    if (r0 + i < rows) {
      quantize_row(h + (long)(r0 + i) * K, xq, xd, xm, xh);
    } else {
      for (int e = 0; e < K; e++) xq[e] = 0;
      for (int b = 0; b < KB; b++) xd[b] = xm[b] = 0.0f, xh[2 * b] = xh[2 * b + 1] = 0;
    }
    for (int b = 0; b < KB; b++) {
      for (int k = 0; k < 8; k++) tile->codes[b][k][i] = ((const int *)xq)[b * 8 + k];
      tile->d[b][i] = xd[b], tile->m[b][i] = xm[b], tile->offset[b][i] = -128 * (xh[2 * b] + xh[2 * b + 1]);
      tile->half_sum[b][0][i] = xh[2 * b], tile->half_sum[b][1][i] = xh[2 * b + 1];
    }
  }
}

#define LANE_SUM8(a) ((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7])))
