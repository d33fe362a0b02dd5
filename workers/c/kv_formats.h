// The KV cache's element formats (workers/kv_quant.py), selected by KV_FORMAT: load16(p) widens the 16 values at p
// to floats (before their scale, for int8 and fp8). Integer bit operations only, no _Float16/__bf16 and no
// conversion instructions beyond the vector extensions, so the code is the same on every x86 or ARM CPU.
#define KV_FLOAT32 0
#define KV_FLOAT16 1
#define KV_BFLOAT16 2
#define KV_INT8 3
#define KV_FP8 4

typedef unsigned short u16x16 __attribute__((vector_size(32), aligned(2)));
typedef unsigned int u32x16 __attribute__((vector_size(64), aligned(4)));
typedef int i32x16 __attribute__((vector_size(64), aligned(4)));

#if KV_FORMAT == KV_FLOAT32
typedef float kv_t;
ALWAYS_INLINE v16 load16(const kv_t *p) { return *(const v16 *)p; }
#elif KV_FORMAT == KV_FLOAT16
typedef unsigned short kv_t;
// normal halves: exponent rebiased by shifting into a float's fields; subnormals (exponent 0): mantissa * 2^-24
ALWAYS_INLINE v16 load16(const kv_t *p) {
  const u32x16 h = __builtin_convertvector(*(const u16x16 *)p, u32x16);
  const u32x16 normal = ((h & 0x7fffu) << 13) + (112u << 23);
  const u32x16 subnormal = (u32x16)(__builtin_convertvector(h & 0x3ffu, v16) * 0x1p-24f);
  const u32x16 is_sub = (u32x16)((h & 0x7c00u) == 0);
  return (v16)((normal & ~is_sub) | (subnormal & is_sub) | ((h & 0x8000u) << 16));
}
#elif KV_FORMAT == KV_BFLOAT16
typedef unsigned short kv_t;
ALWAYS_INLINE v16 load16(const kv_t *p) {
  return (v16)(__builtin_convertvector(*(const u16x16 *)p, u32x16) << 16);
}
#elif KV_FORMAT == KV_INT8
typedef signed char kv_t;
ALWAYS_INLINE v16 load16(const kv_t *p) { return __builtin_convertvector(*(const i8x16 *)p, v16); }
#elif KV_FORMAT == KV_FP8
typedef unsigned char kv_t;
// e4m3: (8 + m) * 2^(e - 10), subnormals (e = 0) 2m * 2^-10, as workers/kv_quant.py decodes them
ALWAYS_INLINE v16 load16(const kv_t *p) {
  const i32x16 c = __builtin_convertvector(*(const u8x16 *)p, i32x16);
  const i32x16 e = (c >> 3) & 15, m = c & 7;
  const i32x16 mantissa = m + 8 + ((e == 0) & (m - 8));
  const v16 magnitude = __builtin_convertvector(mantissa, v16) * (v16)((e + 117) << 23);
  return (v16)((i32x16)magnitude | ((c & 0x80) << 24));
}
#else
#error "unknown KV_FORMAT"
#endif
