// The KV cache's element formats (workers/kv_quant.py), selected by KV_FORMAT: load16(p) widens the 16 values at p
// to floats (before their scale, for int8 and fp8), with kernel.h's bit-exact widenings.
#define KV_FLOAT32 0
#define KV_FLOAT16 1
#define KV_BFLOAT16 2
#define KV_INT8 3
#define KV_FP8 4

#if KV_FORMAT == KV_FLOAT32
typedef float kv_t;
ALWAYS_INLINE v16 load16(const kv_t *p) { return *(const v16 *)p; }
#elif KV_FORMAT == KV_FLOAT16
typedef unsigned short kv_t;
ALWAYS_INLINE v16 load16(const kv_t *p) { return widen_f16(*(const u16x16 *)p); }
#elif KV_FORMAT == KV_BFLOAT16
typedef unsigned short kv_t;
ALWAYS_INLINE v16 load16(const kv_t *p) { return widen_bf16(*(const u16x16 *)p); }
#elif KV_FORMAT == KV_INT8
typedef signed char kv_t;
ALWAYS_INLINE v16 load16(const kv_t *p) { return __builtin_convertvector(*(const i8x16 *)p, v16); }
#elif KV_FORMAT == KV_FP8
typedef unsigned char kv_t;
ALWAYS_INLINE v16 load16(const kv_t *p) { return widen_e4m3(*(const u8x16 *)p); }
#else
#error "unknown KV_FORMAT"
#endif
