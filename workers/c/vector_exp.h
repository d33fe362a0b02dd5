// e^x 16 lanes at a time for the kernels that need it (attention.c's softmax, swiglu.c's sigmoid). Needs kernel.h.
typedef int i32x16 __attribute__((vector_size(64), aligned(4)));

// lane i: a[i] where mask lane i is all ones, else b[i]
ALWAYS_INLINE v16 select16(i32x16 mask, v16 a, v16 b) { return (v16)((mask & (i32x16)a) | (~mask & (i32x16)b)); }

// e^x for x <= 0, 16 lanes: e^r * 2^n, n = round(x log2 e) (by adding and subtracting 1.5 * 2^23), r = x - n ln 2 in
// two steps (ln 2's high part has 15 bits and |n| <= 126, so n ln2_hi is exact: r keeps x's precision, where x log2 e
// in one float lost up to 2^-24 |x log2 e| of it), |r| <= ln 2 / 2, e^r by its Taylor series to degree 7 (~1 ulp).
// 0 below -87 (where 2^n would leave the normal floats), NaN for NaN (computed from 0: no NaN meets an integer).
ALWAYS_INLINE v16 exp_nonpositive16(v16 x_in) {
  const i32x16 nan = (i32x16)(x_in != x_in), underflow = (i32x16)(x_in < -87.0f);
  const v16 x = select16(nan | underflow, (v16){0}, x_in);
  const v16 n = (x * 1.4426950408889634f + 12582912.0f) - 12582912.0f;
  const v16 r = (x - n * 0.693145751953125f) - n * 1.4286068203094172e-6f;
  v16 p = (v16){0} + 1.9841270e-4f;
  p = p * r + 1.3888889e-3f;
  p = p * r + 8.3333333e-3f;
  p = p * r + 4.1666667e-2f;
  p = p * r + 1.6666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return select16(nan, x_in, select16(underflow, (v16){0}, p * (v16)((__builtin_convertvector(n, i32x16) + 127) << 23)));
}
