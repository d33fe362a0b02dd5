// out[ROWS, COLS] = h[ROWS, K] @ weight.T for GEMM_MIN_ROWS rows or more (workers/cpu_gemm.py). Core core_id of CORES
// takes its share of the columns in panels of NR weight rows: a panel is dequantised once into an L1-sized
// float32 buffer, then every tile of MR activation rows runs against it with MR x NR vector accumulators.
// Defines: ROWS, COLS, K, CORES and the weight kind (weights.h).
#include "kernel.h"
#include "weights.h"

#define PER_CORE ((COLS + CORES - 1) / CORES)
#define MR 4
#if defined(__AVX512F__)
#define NR 4
#else
#define NR 2
#endif

#if MR * NR == 16
// lane s of the result = the sum of a[s]'s 16 lanes: a transpose-and-add tree, 15 steps instead of 16 lane sums
#define HALVES(x, y, lo, hi) (__builtin_shufflevector(x, y, lo) + __builtin_shufflevector(x, y, hi))
#define L1_LO 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define L1_HI 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define L2_LO 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define L2_HI 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define L3_LO 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define L3_HI 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define L4_LO 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define L4_HI 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
ALWAYS_INLINE v16 sum_each_of_16(const v16 *a) {
  v16 l1[8], l2[4], l3[2];
  for (int i = 0; i < 8; i++) l1[i] = HALVES(a[2 * i], a[2 * i + 1], L1_LO, L1_HI);
  for (int i = 0; i < 4; i++) l2[i] = HALVES(l1[2 * i], l1[2 * i + 1], L2_LO, L2_HI);
  for (int i = 0; i < 2; i++) l3[i] = HALVES(l2[2 * i], l2[2 * i + 1], L3_LO, L3_HI);
  return HALVES(l3[0], l3[1], L4_LO, L4_HI);
}
#endif

// out[t0 .. t0+mr, n0 .. n0+nr] from the dequantised panel; MR x NR is the register tile, smaller at the edges
ALWAYS_INLINE void tile(float *restrict out, const float *restrict h, const float *restrict panel, int t0, int n0,
                        int mr, int nr) {
#pragma clang fp reassociate(on)
  if (mr == MR && nr == NR) {
    v16 acc[MR][NR];
    for (int i = 0; i < MR; i++) for (int j = 0; j < NR; j++) acc[i][j] = (v16){0};
    for (int c = 0; c < K; c += 16) {
      v16 x[MR], w[NR];
      for (int i = 0; i < MR; i++) x[i] = *(const v16 *)(h + (long)(t0 + i) * K + c);
      for (int j = 0; j < NR; j++) w[j] = *(const v16 *)(panel + j * K + c);
      for (int i = 0; i < MR; i++) for (int j = 0; j < NR; j++) acc[i][j] += x[i] * w[j];
    }
#if MR * NR == 16
    const v16 sums = sum_each_of_16(&acc[0][0]);
    for (int i = 0; i < MR; i++) for (int j = 0; j < NR; j++) out[(long)(t0 + i) * COLS + n0 + j] = sums[i * NR + j];
#else
    for (int i = 0; i < MR; i++) for (int j = 0; j < NR; j++) out[(long)(t0 + i) * COLS + n0 + j] = lane_sum(acc[i][j]);
#endif
    return;
  }
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++) {
      v16 acc = (v16){0};
      for (int c = 0; c < K; c += 16) acc += *(const v16 *)(h + (long)(t0 + i) * K + c) * *(const v16 *)(panel + j * K + c);
      out[(long)(t0 + i) * COLS + n0 + j] = lane_sum(acc);
    }
}

void gemm(float *restrict out, const float *restrict h, WEIGHT_PARAMS, int core_id) {
  float panel[NR * K] __attribute__((aligned(64)));
  const int n_end = (core_id + 1) * PER_CORE < COLS ? (core_id + 1) * PER_CORE : COLS;
  for (int n0 = core_id * PER_CORE; n0 < n_end; n0 += NR) {
    const int nr = n_end - n0 < NR ? n_end - n0 : NR;
    for (int j = 0; j < nr; j++) {
      const int n = n0 + j;
      for (int b0 = 0; b0 < KB; b0 += BLOCK_GROUP)
#pragma unroll
        for (int b = b0; b < b0 + BLOCK_GROUP; b++)
          dequant_block(WEIGHT_ARGS, n, b, (v16 *)(panel + j * K + b * 32), (v16 *)(panel + j * K + b * 32 + 16));
    }
    for (int t0 = 0; t0 < ROWS; t0 += MR) tile(out, h, panel, t0, n0, ROWS - t0 < MR ? ROWS - t0 : MR, nr);
  }
}
