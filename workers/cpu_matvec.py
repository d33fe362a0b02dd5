"""Matrix products of a few rows (below workers/cpu_gemm.py's GEMM_MIN_ROWS) on the CPU backend, as hand-written
C kernels for F32, Q4_1 and Q8_0 weights.

tinygrad's generated kernels for these reduced each 32-element block into a scalar, so every block ended in a
horizontal vector sum. These kernels keep one 16-lane accumulator per activation row
across the whole reduction and sum its lanes once per output: per block, the weight's 32 values are dequantised
into two vectors (q * d + m) once and multiplied into every activation row. The C uses clang's portable vector
extensions (no intrinsics), so it compiles to AVX-512, AVX2 or NEON code with `-march=native`.

Each kernel is a tinygrad PROGRAM (workers/c_kernel.py); its output columns are split across cores through
tinygrad's `core_id` argument. Shapes, row count and core count are compile-time constants.
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.renderer import Estimates

from tinyvllm.workers.c_kernel import VECTOR_TYPES, c_kernel


# weight row n's 32-element block b as two 16-lane vectors w0 (elements 0-15) and w1 (16-31); K, KB = K / 32
DEQUANT_BLOCK = {
    "F32": """      const v16 w0 = *(const v16 *)(weight + (long)n * K + b * 32), w1 = *(const v16 *)(weight + (long)n * K + b * 32 + 16);""",
    "Q4_1": """      const u8x16 q = *(const u8x16 *)(weight + ((long)n * KB + b) * 16);
      const float scale = d[(long)n * KB + b], low = m[(long)n * KB + b];
      const v16 w0 = __builtin_convertvector(q & (unsigned char)15, v16) * scale + low;
      const v16 w1 = __builtin_convertvector(q >> 4, v16) * scale + low;""",
    "Q8_0": """      const i8x16 q0 = *(const i8x16 *)(weight + ((long)n * KB + b) * 32);
      const i8x16 q1 = *(const i8x16 *)(weight + ((long)n * KB + b) * 32 + 16);
      const float scale = d[(long)n * KB + b];
      const v16 w0 = __builtin_convertvector(q0, v16) * scale, w1 = __builtin_convertvector(q1, v16) * scale;""",
}
WEIGHT_PARAMS = {  # DeviceWeight.parts as C parameters
    "F32": "const float *restrict weight",
    "Q4_1": "const unsigned char *restrict weight, const float *restrict d, const float *restrict m",
    "Q8_0": "const signed char *restrict weight, const float *restrict d",
}
BLOCK_BYTES = {"F32": 128, "Q4_1": 20, "Q8_0": 34}  # bytes of one 32-element block as stored in GGUF
# prefetch weight row `ahead` (its quantised values and scales): the hardware prefetcher alone left the
# matvec at a third of the rate a plain read of the weights reaches here
PREFETCH_ROW = {
    "F32": "for (int i = 0; i < K; i += 16) __builtin_prefetch(weight + (long)ahead * K + i);",
    "Q4_1": "for (int i = 0; i < KB * 16; i += 64) __builtin_prefetch(weight + (long)ahead * KB * 16 + i);\n"
            "        for (int i = 0; i < KB; i += 16) { __builtin_prefetch(d + (long)ahead * KB + i); __builtin_prefetch(m + (long)ahead * KB + i); }",
    "Q8_0": "for (int i = 0; i < KB * 32; i += 64) __builtin_prefetch(weight + (long)ahead * KB * 32 + i);\n"
            "        for (int i = 0; i < KB; i += 16) __builtin_prefetch(d + (long)ahead * KB + i);",
}


def c_kernels_support(w) -> bool:
    """Whether cpu_matvec and workers/cpu_gemm.py's cpu_gemm take this DeviceWeight (whole 32-blocks per row)."""
    return w.kind in WEIGHT_PARAMS and w.shape[1] % 32 == 0


def matvec_source(name: str, kind: str, rows: int, cols: int, k: int, cores: int) -> str:
    """C for out[rows, cols] = h[rows, k] @ w.T, core `core_id` of `cores` computing its share of the columns."""
    return VECTOR_TYPES + f"""#pragma clang fp reassociate(on)
#if defined(__AVX512F__)
#define ROW_TILE 16
#else
#define ROW_TILE 8
#endif
#define ROWS {rows}
#define COLS {cols}
#define K {k}
#define KB {k // 32}
#define PER_CORE {-(-cols // cores)}
#define PREFETCH_AHEAD 4
void {name}(float *restrict out, const float *restrict h, {WEIGHT_PARAMS[kind]}, int core_id) {{
  const int n_end = (core_id + 1) * PER_CORE < COLS ? (core_id + 1) * PER_CORE : COLS;
  for (int n = core_id * PER_CORE; n < n_end; n++) {{
    if (n + PREFETCH_AHEAD < n_end) {{
      const int ahead = n + PREFETCH_AHEAD;
      {PREFETCH_ROW[kind]}
    }}
    for (int t0 = 0; t0 < ROWS; t0 += ROW_TILE) {{
      const int tiles = ROWS - t0 < ROW_TILE ? ROWS - t0 : ROW_TILE;
      v16 acc[ROW_TILE];
      for (int t = 0; t < ROW_TILE; t++) acc[t] = (v16){{0}};
      for (int b = 0; b < KB; b++) {{
{DEQUANT_BLOCK[kind]}
        for (int t = 0; t < tiles; t++) {{
          const float *x = h + (long)(t0 + t) * K + b * 32;
          acc[t] += w0 * *(const v16 *)x + w1 * *(const v16 *)(x + 16);
        }}
      }}
      for (int t = 0; t < tiles; t++) out[(long)(t0 + t) * COLS + n] = lane_sum(acc[t]);
    }}
  }}
}}
"""


def c_matmul(h: Tensor, w, prefix: str, render) -> Tensor:
    """h [T, K] @ w.T for a workers.quantized_weight.DeviceWeight w [N, K] (c_kernels_support): [T, N] float32,
    by the kernel render(name, kind, rows, cols, k, cores) returns the C of (columns split across cores)."""
    assert c_kernels_support(w), w
    (rows, k), cols = h.shape, w.shape[0]
    cores = max(1, min(NUM_CPU_THREADS.value, cols))
    name = f"{prefix}_{w.kind.lower()}_{rows}_{cols}_{k}_c{cores}"
    weight_bytes = cols * k * BLOCK_BYTES[w.kind] // 32
    fxn = c_kernel(name, render(name, w.kind, rows, cols, k, cores), cores, Estimates(
        ops=2 * rows * cols * k, lds=weight_bytes + 4 * rows * k, mem=weight_bytes + 4 * rows * (k + cols)))
    out = Tensor.empty(rows, cols, dtype=dtypes.float32, device=h.device)
    return out.custom_kernel(h.float().contiguous(), *w.parts, fxn=fxn)[0]


def cpu_matvec(h: Tensor, w) -> Tensor:
    """h [T, K] @ w.T (see c_matmul). Best for a few rows; workers/cpu_gemm.py's register tiles win from
    GEMM_MIN_ROWS rows."""
    return c_matmul(h, w, "matvec", matvec_source)
