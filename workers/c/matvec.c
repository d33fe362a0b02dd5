// out[ROWS, COLS] = h[ROWS, K] @ weight.T for a few rows (workers/cpu_matvec.py): one 16-lane accumulator per
// activation row across the whole reduction, its lanes summed once per output. Core core_id of CORES computes
// its share of the columns. Defines: ROWS, COLS, K, CORES and the weight kind (weights.h).
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

void matvec(float *restrict out, const float *restrict h, WEIGHT_PARAMS, int core_id) {
  const int n_end = (core_id + 1) * PER_CORE < COLS ? (core_id + 1) * PER_CORE : COLS;
  for (int n = core_id * PER_CORE; n < n_end; n++) {
    for (int t0 = 0; t0 < ROWS; t0 += ROW_TILE) {
      const int tiles = ROWS - t0 < ROW_TILE ? ROWS - t0 : ROW_TILE;
      v16 acc[ROW_TILE];
      for (int t = 0; t < ROW_TILE; t++) acc[t] = (v16){0};
      for (int b0 = 0; b0 < KB; b0 += BLOCK_GROUP) {
        if (t0 == 0 && n + PREFETCH_AHEAD < n_end) prefetch_blocks(WEIGHT_ARGS, n + PREFETCH_AHEAD, b0, BLOCK_GROUP);
#pragma unroll
        for (int b = b0; b < b0 + BLOCK_GROUP; b++) {
          v16 w0, w1;
          dequant_block(WEIGHT_ARGS, n, b, &w0, &w1);
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
