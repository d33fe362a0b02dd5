// out[ROWS, COLS] = h[ROWS, K] @ weight.T for a few rows (workers/cpu_matvec.py): one 16-lane accumulator per
// activation row across the whole reduction, its lanes summed once per output. Core core_id of CORES computes
// its share of the columns. Defines: ROWS, COLS, K, CORES and the weight kind (weights.h); EXPERTS: each row has an
// expert of its own (a mixture of experts' decode), whose COLS rows the weight holds after the experts before it.
#include "kernel.h"
#include "weights.h"

#pragma clang fp reassociate(on)
#if defined(__AVX512F__)
#define ROW_TILE 16
#else
#define ROW_TILE 8
#endif
#define PER_CORE ((COLS + CORES - 1) / CORES)
#define PREFETCH_AHEAD 4

// out[rows, COLS] = h[rows, K] @ (weight rows base .. base + COLS - 1).T
ALWAYS_INLINE void rows_product(float *restrict out, const float *restrict h, int rows, WEIGHT_PARAMS, int core_id,
                               long base) {
  const int n_end = (core_id + 1) * PER_CORE < COLS ? (core_id + 1) * PER_CORE : COLS;
  for (int n = core_id * PER_CORE; n < n_end; n++) {
    for (int t0 = 0; t0 < rows; t0 += ROW_TILE) {
      const int tiles = rows - t0 < ROW_TILE ? rows - t0 : ROW_TILE;
      v16 acc[ROW_TILE];
      for (int t = 0; t < ROW_TILE; t++) acc[t] = (v16){0};
      for (int b0 = 0; b0 < KB; b0 += BLOCK_GROUP) {
        if (t0 == 0 && n + PREFETCH_AHEAD < n_end)
          prefetch_blocks(WEIGHT_ARGS, base + n + PREFETCH_AHEAD, b0, BLOCK_GROUP);
#pragma unroll
        for (int b = b0; b < b0 + BLOCK_GROUP; b++) {
          v16 w0, w1;
          dequant_block(WEIGHT_ARGS, base + n, b, &w0, &w1);
          for (int t = 0; t < tiles; t++) {
            const float *x = h + (long)(t0 + t) * K + b * 32;
            acc[t] += w0 * *(const v16 *)x + w1 * *(const v16 *)(x + 16);
          }
        }
      }
      for (int t = 0; t < tiles; t++) out[(long)(t0 + t) * COLS + n] = lane_sum(acc[t]);
    }
  }
}

#if defined(EXPERTS)
// Mixture-of-experts products: row t of h times the COLS weight rows of expert experts[t] (matvec_i8.c's EXPERTS)
void matvec(float *restrict out, const float *restrict h, const int *restrict experts, WEIGHT_PARAMS, int core_id) {
  for (int t = 0; t < ROWS; t++) {  // an id out of range (never from a top-k) reads expert 0, as matvec_i8.c
    const int e = (unsigned)experts[t] < N_EXPERTS ? experts[t] : 0;
    rows_product(out + (long)t * COLS, h + (long)t * K, 1, WEIGHT_ARGS, core_id, (long)e * COLS);
  }
}
#else
void matvec(float *restrict out, const float *restrict h, WEIGHT_PARAMS, int core_id) {
  rows_product(out, h, ROWS, WEIGHT_ARGS, core_id, 0);
}
#endif
