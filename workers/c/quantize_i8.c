// h[ROWS, K] as int8 codes per 32-element block (int8_rows.h), in the tiles of 4 rows gemm_i8.c reads: quantised
// once per product, not once per core, and once for the products that share an input (q, k and v; gate and up).
// Core core_id of CORES writes its share of the tiles.
#include "kernel.h"
#include "int8_rows.h"

#define TILES ((ROWS + 3) / 4)
#define PER_CORE ((TILES + CORES - 1) / CORES)

void quantize_i8(tile_t *restrict tiles, const float *restrict h, int core_id) {
  const int t_end = (core_id + 1) * PER_CORE < TILES ? (core_id + 1) * PER_CORE : TILES;
  for (int t = core_id * PER_CORE; t < t_end; t++) quantize_tile(h, ROWS, 4 * t, &tiles[t]);
}
