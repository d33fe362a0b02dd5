// out[N] = silu(gate) * up (N = ROWS x COLS floats; silu(x) = x / (1 + e^-x)), the SwiGLU between an MLP's gate|up
// and down products (workers/cpu_swiglu.py), 16 lanes at a time: tinygrad's generated kernel computes e^x by a
// polynomial of scalar steps (a 256 x 8192 prompt chunk's took 7.7 ms). Core core_id of CORES takes its share.
#include "kernel.h"
#include "vector_exp.h"

#define N (ROWS * COLS)
#define PER_CORE (((N + CORES - 1) / CORES + 15) / 16 * 16)

// x sigmoid(x) from e^-|x| (never overflows): sigmoid(x) = 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below
ALWAYS_INLINE v16 silu16(v16 x) {
  const i32x16 negative = (i32x16)(x < 0.0f);
  const v16 e = exp_nonpositive16(select16(negative, x, -x)), inverse = 1.0f / (1.0f + e);
  return x * select16(negative, e * inverse, inverse);
}

void swiglu(float *restrict out, const float *restrict gate, const float *restrict up, int core_id) {
  const int end = (core_id + 1) * PER_CORE < N ? (core_id + 1) * PER_CORE : N;
  int i = core_id * PER_CORE;
  for (; i + 16 <= end; i += 16) *(v16 *)(out + i) = silu16(*(const v16 *)(gate + i)) * *(const v16 *)(up + i);
  if (i < end) {
    v16 g = {0}, u = {0};
    for (int e = 0; i + e < end; e++) g[e] = gate[i + e], u[e] = up[i + e];
    const v16 r = silu16(g) * u;
    for (int e = 0; i + e < end; e++) out[i + e] = r[e];
  }
}
