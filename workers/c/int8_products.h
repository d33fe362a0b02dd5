// Shared by the int8-activation products (matvec_i8.c, gemm_i8.c): the dot-product instructions' headers, the
// weight kinds they take (Q4_0, Q4_1, Q4_K and Q5_K: WEIGHT_NIBBLES; Q8_0, Q6_K and Q3_K: WEIGHT_SIGNED_CODES; Q2_K), the
// rows' arithmetic (int8_rows.h) and each core's share of the columns.
#include "int8_rows.h"

#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#endif
#if !defined(WEIGHT_NIBBLES) && !defined(WEIGHT_SIGNED_CODES) && !defined(WEIGHT_Q2_K)
#error "int8 activations are for Q4_0, Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_0 weights"
#endif
#define PER_CORE ((COLS + CORES - 1) / CORES)

typedef int i32x16 __attribute__((vector_size(64), aligned(64)));
typedef float f32x16 __attribute__((vector_size(64), aligned(64)));

// x, y with their vector index bit s and lane bit s swapped (transpose_rows' steps)
ALWAYS_INLINE void swap_bit(i32x16 *restrict x, i32x16 *restrict y, int s) {
  const i32x16 a = *x, b = *y;
  if (s == 0) {
    *x = __builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    *y = __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  } else if (s == 1) {
    *x = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    *y = __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  } else {
    *x = __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    *y = __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  }
}

// rounds of swapping bit s (s < rounds) of the index of w[0 .. 2^rounds) with the same bit of the lane. With 3 rounds:
// 16 rows of 8 dwords, w[j] holding rows 2j (lanes 0-7) and 2j + 1 (8-15), become w[k] = every row's dword k, row r
// in lane ROW_LANE(r)
#define ROW_LANE(r) (8 * ((r) % 2) + (r) / 2)
ALWAYS_INLINE void transpose_rows(i32x16 *restrict w, int rounds) {
  for (int s = 0; s < rounds; s++)
    for (int j = 0; j < 1 << rounds; j++)
      if (!(j & (1 << s))) swap_bit(&w[j], &w[j | (1 << s)], s);
}

