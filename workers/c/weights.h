// A weight matrix [N, K] as workers/quantized_weight.py's DeviceWeight.parts, in one of the kinds selected by
// a define:
// - WEIGHT_F32 (float32), WEIGHT_F16 or WEIGHT_BF16 (16-bit floats, widened here);
// - WEIGHT_Q4_0: 16 bytes of nibbles and a scale d per 32-element block, the minimum -8 d;
// - WEIGHT_Q4_1: 16 bytes of nibbles, a scale d and a minimum m per 32-element block;
// - WEIGHT_Q8_0: 32 signed bytes, a scale d per block;
// - WEIGHT_Q8_16: 32 signed bytes, a scale d and a minimum m per 16 elements;
// - WEIGHT_F8_E4M3: 32 float8 e4m3 codes, a scale d per block;
// - WEIGHT_Q4_K: Q4_1's nibbles; a 6-bit scale and minimum code per block, a d and dmin per 8 blocks;
// - WEIGHT_Q5_K: Q4_K's, and the file's 32 bytes of fifth bits per 8 blocks;
// - WEIGHT_Q6_K: the file's low 4 bits of the 6-bit codes (128 bytes per 8 blocks) and their high 2 bits (64 bytes
//   per 8 blocks), a signed 8-bit scale per 16 elements, a d per 8 blocks;
// - WEIGHT_Q3_K: the file's 2-bit codes (64 bytes per 8 blocks) and third bits (32 bytes per 8 blocks), a signed
//   8-bit scale per 16 elements, a d per 8 blocks;
// - WEIGHT_Q2_K: the file's 2-bit codes and its byte per 16 elements (a 4-bit scale code, a 4-bit minimum code
//   above it), a d and dmin per 8 blocks.
// Q4_0's, Q4_1's and Q8_0's d and m are halves (their bits) with SCALES_F16 (as GGUF files store them), else floats.
// WEIGHT_PARAMS are its C parameters, WEIGHT_ARGS the same names to pass on. Needs K (a multiple of 32; of 256
// for the K-quants) and kernel.h.
#define KB (K / 32)
#if defined(SCALES_F16)
typedef unsigned short scale_t;
#define SCALE(x) half_to_float(x)
#else
typedef float scale_t;
#define SCALE(x) (x)
#endif

#if defined(WEIGHT_F32)
#define WEIGHT_PARAMS const float *restrict weight
#define WEIGHT_ARGS weight
#elif defined(WEIGHT_F16) || defined(WEIGHT_BF16)
#define WEIGHT_PARAMS const unsigned short *restrict weight
#define WEIGHT_ARGS weight
#elif defined(WEIGHT_F8_E4M3)
#define WEIGHT_PARAMS const unsigned char *restrict weight, const float *restrict d
#define WEIGHT_ARGS weight, d
#elif defined(WEIGHT_Q4_0)
#define WEIGHT_PARAMS const unsigned char *restrict weight, const scale_t *restrict d
#define WEIGHT_ARGS weight, d
#elif defined(WEIGHT_Q4_1)
#define WEIGHT_PARAMS const unsigned char *restrict weight, const scale_t *restrict d, const scale_t *restrict m
#define WEIGHT_ARGS weight, d, m
#elif defined(WEIGHT_Q8_0)
#define WEIGHT_PARAMS const signed char *restrict weight, const scale_t *restrict d
#define WEIGHT_ARGS weight, d
#elif defined(WEIGHT_Q8_16)
#define WEIGHT_PARAMS const signed char *restrict weight, const float *restrict d, const float *restrict m
#define WEIGHT_ARGS weight, d, m
#elif defined(WEIGHT_Q4_K)
#define WEIGHT_PARAMS const unsigned char *restrict weight, const unsigned char *restrict codes, const float *restrict dm
#define WEIGHT_ARGS weight, codes, dm
#elif defined(WEIGHT_Q5_K)
#define WEIGHT_PARAMS const unsigned char *restrict weight, const unsigned char *restrict high, \
                      const unsigned char *restrict codes, const float *restrict dm
#define WEIGHT_ARGS weight, high, codes, dm
#elif defined(WEIGHT_Q6_K) || defined(WEIGHT_Q3_K)
#define WEIGHT_PARAMS const unsigned char *restrict weight, const unsigned char *restrict high, \
                      const signed char *restrict scales, const float *restrict d
#define WEIGHT_ARGS weight, high, scales, d
#elif defined(WEIGHT_Q2_K)
#define WEIGHT_PARAMS const unsigned char *restrict weight, const unsigned char *restrict codes, const float *restrict dm
#define WEIGHT_ARGS weight, codes, dm
#else
#error "define one of WEIGHT_F32, WEIGHT_F16, WEIGHT_BF16, WEIGHT_Q4_0, WEIGHT_Q4_1, WEIGHT_Q8_0, WEIGHT_Q8_16, WEIGHT_F8_E4M3, \
WEIGHT_Q2_K, WEIGHT_Q3_K, WEIGHT_Q4_K, WEIGHT_Q5_K, WEIGHT_Q6_K"
#endif
#if defined(WEIGHT_Q6_K) || defined(WEIGHT_Q3_K) || defined(WEIGHT_Q2_K)
#define WEIGHT_HALF_SCALES  // an integer scale per 16 elements (Q6_K, Q3_K: signed 8-bit; Q2_K: a 4-bit code), a d per
                            // super-block
#endif
#if defined(WEIGHT_Q4_K) || defined(WEIGHT_Q5_K)
#define WEIGHT_K_SCALES  // 6-bit scale and minimum codes per block, the super-block's d and dmin
#endif
#if defined(WEIGHT_K_SCALES) || defined(WEIGHT_HALF_SCALES)
#if K % 256
#error "a K-quant's rows are whole 256-element super-blocks"
#endif
// the kernels walk a row's blocks in groups of BLOCK_GROUP, unrolled: a K-quant's 8 blocks a super-block, so that
// each block's place in it is a constant and its bit fields come out by shifts of fixed counts (a loop over single
// blocks shifted by variable counts, each a mask built by a byte permute: Q6_K's and Q3_K's int8 products took twice
// as long)
#define BLOCK_GROUP 8
#else
#define BLOCK_GROUP 1
#endif
#if defined(WEIGHT_Q4_0) || defined(WEIGHT_Q4_1) || defined(WEIGHT_K_SCALES)
#define WEIGHT_NIBBLES  // 16 bytes of nibbles per block (Q5_K: and their fifth bits) and a minimum:
                        // value = q * scale + minimum
#endif
#if defined(WEIGHT_Q8_0) || defined(WEIGHT_Q6_K) || defined(WEIGHT_Q3_K)
#define WEIGHT_SIGNED_CODES  // 32 signed codes per block: value = q * scale (Q6_K, Q3_K: a scale per 16 of them)
#endif

#if defined(WEIGHT_Q4_0) || defined(WEIGHT_Q4_1) || defined(WEIGHT_Q8_0)
// block i (= n * KB + b)'s scale and (Q4_0, Q4_1) minimum, as the int8 products take them (Q4_0's: -8 d, exactly
// the float32 a Q4_1 copy of it would store)
ALWAYS_INLINE float block_scale(WEIGHT_PARAMS, long i) { return SCALE(d[i]); }
#if defined(WEIGHT_Q4_0)
ALWAYS_INLINE float block_min(WEIGHT_PARAMS, long i) { return SCALE(d[i]) * -8.0f; }
#elif defined(WEIGHT_Q4_1)
ALWAYS_INLINE float block_min(WEIGHT_PARAMS, long i) { return SCALE(m[i]); }
#endif
// blocks i .. i + nb - 1's scales (minimums), zeros from nb on
ALWAYS_INLINE f32x8 scales8(const scale_t *restrict p, int nb) {
#if defined(SCALES_F16) && defined(__F16C__)
  if (nb == 8) return __builtin_ia32_vcvtph2ps256((s16x8)*(const u16x8 *)p);  // one instruction
#endif
#if defined(SCALES_F16)
  u16x16 bits = {0};
  if (nb == 8) bits = __builtin_shufflevector(*(const u16x8 *)p, *(const u16x8 *)p, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                              11, 12, 13, 14, 15);
  else
    for (int e = 0; e < nb; e++) bits[e] = p[e];
  const v16 wide = widen_f16(bits);
  return __builtin_shufflevector(wide, wide, 0, 1, 2, 3, 4, 5, 6, 7);
#else
  return load8(p, nb);
#endif
}
#elif defined(WEIGHT_F8_E4M3)
ALWAYS_INLINE float block_scale(WEIGHT_PARAMS, long i) { return d[i]; }
#elif defined(WEIGHT_K_SCALES)
// the super-block's d (dmin) times the block's 6-bit scale (minimum) code: the float32 product the repacked types
// store (workers/quantized_weight.py), taken here so the device holds a byte where they hold a float
ALWAYS_INLINE float block_scale(WEIGHT_PARAMS, long i) { return dm[i / 8 * 2] * (float)codes[2 * i]; }
ALWAYS_INLINE float block_min(WEIGHT_PARAMS, long i) { return -(dm[i / 8 * 2 + 1] * (float)codes[2 * i + 1]); }
#elif defined(WEIGHT_Q2_K)
// the super-block's d and -dmin; the int8 products multiply each half-block's integer sums by its 4-bit scale and
// minimum codes first (block_half_scale, block_half_min), as llama.cpp's q2_K x q8_K does: exact integers
ALWAYS_INLINE float block_scale(WEIGHT_PARAMS, long i) { return dm[i / 8 * 2]; }
ALWAYS_INLINE float block_min(WEIGHT_PARAMS, long i) { return -dm[i / 8 * 2 + 1]; }
ALWAYS_INLINE int block_half_scale(WEIGHT_PARAMS, long i, int half) { return codes[2 * i + half] & 15; }
ALWAYS_INLINE int block_half_min(WEIGHT_PARAMS, long i, int half) { return codes[2 * i + half] >> 4; }
#elif defined(WEIGHT_HALF_SCALES)
// the super-block's d; the int8 products multiply each half-block's integer sum by its 8-bit scale first
// (block_half_scale), as llama.cpp's q6_K x q8_K does, so the block's sum stays an exact integer
ALWAYS_INLINE float block_scale(WEIGHT_PARAMS, long i) { return d[i / 8]; }
ALWAYS_INLINE int block_half_scale(WEIGHT_PARAMS, long i, int half) { return scales[2 * i + half]; }
#endif

typedef unsigned char u8x32 __attribute__((vector_size(32), aligned(1)));
typedef signed char i8x32 __attribute__((vector_size(32), aligned(1)));
#define LOW_HALF(v) __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define HIGH_HALF(v) __builtin_shufflevector(v, v, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)

// weight row n's block b's codes, elements 0-31 in order, from its 16 nibble bytes (Q5_K: 0..31, its fifth bits
// added: as the file keeps them, 32 bytes per super-block, bit j of byte e the fifth bit of element e of block j)
#if defined(WEIGHT_NIBBLES)
ALWAYS_INLINE u8x32 block_codes32(WEIGHT_PARAMS, int n, int b) {
  const u8x16 q = *(const u8x16 *)(weight + ((long)n * KB + b) * 16);
  u8x32 c = __builtin_shufflevector(q, q >> 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                                    20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31) & (unsigned char)15;
#if defined(WEIGHT_Q5_K)
  // bit j moved to bit 4 (16); unsigned, and b's place in its super-block apart: where b steps through whole
  // super-blocks, the compiler sees j as a constant and shifts by an immediate
  const u8x32 h = *(const u8x32 *)(high + ((unsigned long)n * (KB / 8) + (unsigned)b / 8) * 32);
  const unsigned j = (unsigned)b % 8;
  c |= (j <= 4 ? h << (4 - j) : h >> (j - 4)) & (unsigned char)16;
#endif
  return c;
}
#endif

// Q2_K's and Q3_K's 2-bit codes (Q6_K's codes' high 2 bits) of weight row n's block b, elements 0-31 in order, as
// the file keeps them: 64 bytes per super-block, bits 2j'..2j'+1 of byte e of its half (32 bytes) element e of the
// half's block j'
#if defined(WEIGHT_Q2_K) || defined(WEIGHT_Q3_K) || defined(WEIGHT_Q6_K)
ALWAYS_INLINE u8x32 two_bit_codes32(const unsigned char *restrict weight, int n, int b) {
  const unsigned j = (unsigned)b % 8;  // a constant where b steps through whole super-blocks: shifts by immediates
  const u8x32 q = *(const u8x32 *)(weight + ((unsigned long)n * (KB / 8) + (unsigned)b / 8) * 64 + j / 4 * 32);
  return (q >> (2 * (j % 4))) & (unsigned char)3;
}
#endif

// Q6_K's codes of weight row n's block b before the -32 (0..63), elements 0-31 in order, as the file keeps them:
// each 128-element half of a super-block in 64 bytes of low nibbles (bytes 0-31: blocks 0 and 2 of the half, 32-63:
// blocks 1 and 3, low nibble first) and the high 2 bits as two_bit_codes32 reads them
#if defined(WEIGHT_Q6_K)
ALWAYS_INLINE u8x32 six_bit_codes32(WEIGHT_PARAMS, int n, int b) {
  const unsigned j = (unsigned)b % 8;  // a constant where b steps through whole super-blocks
  const u8x32 low = *(const u8x32 *)(weight + ((unsigned long)n * (KB / 8) + (unsigned)b / 8) * 128 + j / 4 * 64 +
                                     j % 2 * 32);
  return ((low >> (4 * (j % 4 / 2))) & (unsigned char)15) | (two_bit_codes32(high, n, b) << 4);
}
#endif

// Q6_K's and Q3_K's codes of weight row n's block b as stored, before the CODE_OFFSET their values subtract (Q6_K:
// six_bit_codes32, 0..63; Q3_K: its 2-bit codes and third bits, as Q5_K's fifth bits, 0..7), elements 0-31 in order:
// the unsigned factor the int8 products take, the offset taken once per 16 codes from the activations' sums
#if defined(WEIGHT_Q6_K)
#define CODE_OFFSET 32
ALWAYS_INLINE u8x32 unsigned_codes32(WEIGHT_PARAMS, int n, int b) { return six_bit_codes32(WEIGHT_ARGS, n, b); }
#elif defined(WEIGHT_Q3_K)
#define CODE_OFFSET 4
ALWAYS_INLINE u8x32 unsigned_codes32(WEIGHT_PARAMS, int n, int b) {
  const unsigned j = (unsigned)b % 8;
  const u8x32 h = *(const u8x32 *)(high + ((unsigned long)n * (KB / 8) + (unsigned)b / 8) * 32);
  return two_bit_codes32(weight, n, b) | (((h >> j) & (unsigned char)1) << 2);
}
#endif

// weight row n's block b's 32 signed codes, elements 0-31 in order (Q6_K, Q3_K: unsigned_codes32 - CODE_OFFSET)
#if defined(WEIGHT_SIGNED_CODES)
ALWAYS_INLINE i8x32 block_signed_codes(WEIGHT_PARAMS, int n, int b) {
#if defined(CODE_OFFSET)
  return (i8x32)unsigned_codes32(WEIGHT_ARGS, n, b) - (signed char)CODE_OFFSET;
#else
  return *(const i8x32 *)(weight + ((long)n * KB + b) * 32);
#endif
}
#endif

// weight row n's 32-element block b as two 16-lane vectors: elements 0-15 in *w0, 16-31 in *w1
ALWAYS_INLINE void dequant_block(WEIGHT_PARAMS, int n, int b, v16 *w0, v16 *w1) {
#if defined(WEIGHT_F32)
  *w0 = *(const v16 *)(weight + (long)n * K + b * 32);
  *w1 = *(const v16 *)(weight + (long)n * K + b * 32 + 16);
#elif defined(WEIGHT_F16) || defined(WEIGHT_BF16)
  const u16x16 v0 = *(const u16x16 *)(weight + (long)n * K + b * 32);
  const u16x16 v1 = *(const u16x16 *)(weight + (long)n * K + b * 32 + 16);
#if defined(WEIGHT_BF16)
  *w0 = widen_bf16(v0);
  *w1 = widen_bf16(v1);
#else
  *w0 = widen_f16(v0);
  *w1 = widen_f16(v1);
#endif
#elif defined(WEIGHT_F8_E4M3)
  const u8x16 q0 = *(const u8x16 *)(weight + ((long)n * KB + b) * 32);
  const u8x16 q1 = *(const u8x16 *)(weight + ((long)n * KB + b) * 32 + 16);
  const float scale = d[(long)n * KB + b];
  *w0 = widen_e4m3(q0) * scale;
  *w1 = widen_e4m3(q1) * scale;
#elif defined(WEIGHT_NIBBLES)
  const u8x32 c = block_codes32(WEIGHT_ARGS, n, b);
  const float scale = block_scale(WEIGHT_ARGS, (long)n * KB + b), low = block_min(WEIGHT_ARGS, (long)n * KB + b);
  *w0 = __builtin_convertvector(LOW_HALF(c), v16) * scale + low;
  *w1 = __builtin_convertvector(HIGH_HALF(c), v16) * scale + low;
#elif defined(WEIGHT_Q2_K)
  const u8x32 c = two_bit_codes32(weight, n, b);
  const long i = (long)n * KB + b;
  const float super_d = dm[i / 8 * 2], super_min = dm[i / 8 * 2 + 1];
  *w0 = __builtin_convertvector(LOW_HALF(c), v16) * (super_d * (float)(codes[2 * i] & 15)) -
        super_min * (float)(codes[2 * i] >> 4);
  *w1 = __builtin_convertvector(HIGH_HALF(c), v16) * (super_d * (float)(codes[2 * i + 1] & 15)) -
        super_min * (float)(codes[2 * i + 1] >> 4);
#elif defined(WEIGHT_Q8_16)
  const i8x16 q0 = *(const i8x16 *)(weight + ((long)n * KB + b) * 32);
  const i8x16 q1 = *(const i8x16 *)(weight + ((long)n * KB + b) * 32 + 16);
  const long half = ((long)n * KB + b) * 2;
  *w0 = __builtin_convertvector(q0, v16) * d[half] + m[half];
  *w1 = __builtin_convertvector(q1, v16) * d[half + 1] + m[half + 1];
#elif defined(WEIGHT_HALF_SCALES)
  const i8x32 q = block_signed_codes(WEIGHT_ARGS, n, b);
  const long half = ((long)n * KB + b) * 2;
  const float super = d[((long)n * KB + b) / 8];
  *w0 = __builtin_convertvector(LOW_HALF(q), v16) * (super * (float)scales[half]);
  *w1 = __builtin_convertvector(HIGH_HALF(q), v16) * (super * (float)scales[half + 1]);
#else
  const i8x16 q0 = *(const i8x16 *)(weight + ((long)n * KB + b) * 32);
  const i8x16 q1 = *(const i8x16 *)(weight + ((long)n * KB + b) * 32 + 16);
  const float scale = block_scale(WEIGHT_ARGS, (long)n * KB + b);
  *w0 = __builtin_convertvector(q0, v16) * scale;
  *w1 = __builtin_convertvector(q1, v16) * scale;
#endif
}

// brings weight row n (its values and scales) towards the cache: the hardware prefetcher alone left the matvec
// at a third of the rate a plain read of the weights reaches here
// the cache lines of bytes [from, to) of p
ALWAYS_INLINE void prefetch_bytes(const void *p, long from, long to) {
  for (long i = from; i < to; i += 64) __builtin_prefetch((const char *)p + i);
  __builtin_prefetch((const char *)p + to - 1);
}

// row n's blocks b0 .. b0 + nb - 1, every part the kernels read for them (a kernel that streams a row asks for a
// few blocks at a time, as far ahead as it likes: a whole row's lines at once were more than the core keeps in flight)
ALWAYS_INLINE void prefetch_blocks(WEIGHT_PARAMS, int n, int b0, int nb) {
  const long first = (long)n * KB + b0, end = first + nb;  // block indices
#if defined(WEIGHT_F32)
  prefetch_bytes(weight, first * 128, end * 128);
#elif defined(WEIGHT_F16) || defined(WEIGHT_BF16)
  prefetch_bytes(weight, first * 64, end * 64);
#elif defined(WEIGHT_Q4_0) || defined(WEIGHT_Q4_1)
  prefetch_bytes(weight, first * 16, end * 16);
  prefetch_bytes(d, first * (long)sizeof(*d), end * (long)sizeof(*d));
#if defined(WEIGHT_Q4_1)
  prefetch_bytes(m, first * (long)sizeof(*m), end * (long)sizeof(*m));
#endif
#elif defined(WEIGHT_K_SCALES) || defined(WEIGHT_Q2_K)  // codes: a byte or two per block; d and dmin per 8 blocks
#if defined(WEIGHT_Q2_K)
  prefetch_bytes(weight, first * 8, end * 8);
#else
  prefetch_bytes(weight, first * 16, end * 16);
#endif
#if defined(WEIGHT_Q5_K)
  prefetch_bytes(high, first * 4, end * 4);  // 32 bytes per 8 blocks
#endif
  prefetch_bytes(codes, first * 2, end * 2);
  prefetch_bytes(dm, first, end);  // 2 floats per 8 blocks
#elif defined(WEIGHT_HALF_SCALES)
#if defined(WEIGHT_Q3_K)
  prefetch_bytes(weight, first * 8, end * 8);
  prefetch_bytes(high, first * 4, end * 4);
#else
  prefetch_bytes(weight, first * 16, end * 16);
  prefetch_bytes(high, first * 8, end * 8);
#endif
  prefetch_bytes(scales, first * 2, end * 2);
  prefetch_bytes(d, first / 2, (end + 1) / 2);  // a float per 8 blocks
#elif defined(WEIGHT_Q8_16)
  prefetch_bytes(weight, first * 32, end * 32);
  prefetch_bytes(d, first * 8, end * 8);
  prefetch_bytes(m, first * 8, end * 8);
#else  // Q8_0, F8_E4M3
  prefetch_bytes(weight, first * 32, end * 32);
  prefetch_bytes(d, first * (long)sizeof(*d), end * (long)sizeof(*d));
#endif
}

ALWAYS_INLINE void prefetch_row(WEIGHT_PARAMS, int n) { prefetch_blocks(WEIGHT_ARGS, n, 0, KB); }
