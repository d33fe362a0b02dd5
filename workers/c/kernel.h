// Shared by the C kernels in this folder: clang vector types (16 floats; 16 bytes of quantised values) and a
// lane sum. Portable vector extensions, no intrinsics: clang compiles them to AVX-512, AVX2, SSE or NEON code.
// tinygrad compiles a kernel from its source text, so workers/c_kernel.py pastes this file in for the #include.
#define ALWAYS_INLINE static inline __attribute__((always_inline))  // an entry point must be a program's only function
// Vectors wider than the target's registers pass between always-inlined functions only: clang's note that their
// ABI would differ under AVX-512 is noise on a worker's console.
#pragma clang diagnostic ignored "-Wpsabi"

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef unsigned char u8x16 __attribute__((vector_size(16), aligned(1)));
typedef signed char i8x16 __attribute__((vector_size(16), aligned(1)));
typedef unsigned short u16x16 __attribute__((vector_size(32), aligned(2)));
typedef unsigned int u32x16 __attribute__((vector_size(64), aligned(4)));
typedef int s32x16 __attribute__((vector_size(64), aligned(4)));

// Half, bfloat16 and float8 e4m3 values (their bits) as floats, exactly for every finite value, for the KV cache's
// formats (kv_formats.h) and the weights' (weights.h). With F16C (x86-64 CPUs since 2013) halves take its conversion instruction, and e4m3
// codes become halves first (their fields shifted into a half's, then x 2^8); without it, integer bit operations
// only, the same on every x86 or ARM CPU. Neither makes a float subnormal on the way (a flush-to-zero mode cannot
// change a value). A half's infinities and NaNs stay so on both (the weights' float16 scales may hold them);
// e4m3's NaN codes (0x7f, 0xff) come out as +-480 on both.
typedef short s16x8 __attribute__((vector_size(16)));
typedef float f32x8 __attribute__((vector_size(32), aligned(4)));

// half: normal ones rebiased by shifting into a float's fields; subnormals (exponent 0): mantissa * 2^-24
ALWAYS_INLINE v16 widen_f16(u16x16 bits) {
#if defined(__F16C__)
  const f32x8 lo = __builtin_ia32_vcvtph2ps256((s16x8)__builtin_shufflevector(bits, bits, 0, 1, 2, 3, 4, 5, 6, 7));
  const f32x8 hi = __builtin_ia32_vcvtph2ps256((s16x8)__builtin_shufflevector(bits, bits, 8, 9, 10, 11, 12, 13, 14, 15));
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  const u32x16 h = __builtin_convertvector(bits, u32x16);
  const u32x16 is_inf_nan = (u32x16)((h & 0x7c00u) == 0x7c00u);  // exponent 31 -> 255: 112 more
  const u32x16 normal = ((h & 0x7fffu) << 13) + (112u << 23) + (is_inf_nan & (112u << 23));
  const u32x16 subnormal = (u32x16)(__builtin_convertvector(h & 0x3ffu, v16) * 0x1p-24f);
  const u32x16 is_sub = (u32x16)((h & 0x7c00u) == 0);
  return (v16)((normal & ~is_sub) | (subnormal & is_sub) | ((h & 0x8000u) << 16));
#endif
}

// p[0 .. n) as 8 lanes, zeros after
ALWAYS_INLINE f32x8 load8(const float *p, int n) {
  if (n == 8) return *(const f32x8 *)p;
  f32x8 r = {0};
  for (int i = 0; i < n; i++) r[i] = p[i];
  return r;
}

typedef unsigned short u16x8 __attribute__((vector_size(16), aligned(2)));
ALWAYS_INLINE float half_to_float(unsigned short bits) {
  const u16x16 v = {bits};
  return widen_f16(v)[0];
}

ALWAYS_INLINE v16 widen_bf16(u16x16 bits) { return (v16)(__builtin_convertvector(bits, u32x16) << 16); }

// e4m3: (8 + m) * 2^(e - 10), subnormals (e = 0) 2m * 2^-10, as workers/kv_quant.py decodes them
ALWAYS_INLINE v16 widen_e4m3(u8x16 codes) {
#if defined(__F16C__)
  const u16x16 c = __builtin_convertvector(codes, u16x16);
  return widen_f16(((c & 0x7f) << 7) | ((c & 0x80) << 8)) * 0x1p8f;
#else
  const u32x16 c = __builtin_convertvector(codes, u32x16);
  const s32x16 e = (s32x16)((c >> 3) & 15u), m = (s32x16)(c & 7u);
  const s32x16 mantissa = m + 8 + ((e == 0) & (m - 8));
  const v16 magnitude = __builtin_convertvector(mantissa, v16) * (v16)((e + 117) << 23);
  return (v16)((u32x16)magnitude | ((c & 0x80u) << 24));
#endif
}

ALWAYS_INLINE float lane_sum(v16 v) {
#pragma clang fp reassociate(on)
  float s = 0.0f;
  for (int i = 0; i < 16; i++) s += v[i];
  return s;
}
