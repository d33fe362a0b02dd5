// Shared by the C kernels in this folder: clang vector types (16 floats; 16 bytes of quantised values) and a
// lane sum. Portable vector extensions, no intrinsics: clang compiles them to AVX-512, AVX2, SSE or NEON code.
// tinygrad compiles a kernel from its source text, so workers/c_kernel.py pastes this file in for the #include.
#define ALWAYS_INLINE static inline __attribute__((always_inline))  // an entry point must be a program's only function

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef unsigned char u8x16 __attribute__((vector_size(16), aligned(1)));
typedef signed char i8x16 __attribute__((vector_size(16), aligned(1)));

ALWAYS_INLINE float lane_sum(v16 v) {
#pragma clang fp reassociate(on)
  float s = 0.0f;
  for (int i = 0; i < 16; i++) s += v[i];
  return s;
}
