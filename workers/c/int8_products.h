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
