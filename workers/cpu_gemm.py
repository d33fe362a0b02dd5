"""Matrix products of GEMM_MIN_ROWS or more rows (decode batches, prefill chunks) on the CPU backend, in C.

out[T, N] = h[T, K] @ w.T, w float32, Q4_1 or Q8_0. Each core takes its share of the output columns in panels
of NR weight rows: the panel is dequantised once into a small float32 buffer (L1-sized: NR x K floats), then
every tile of MR activation rows runs against it with MR x NR vector accumulators over K (each loaded value
feeds NR or MR multiply-adds). So a quantised weight is read once per product, not dequantised into a
float32 copy in memory first (what workers/cpu_matmul.py's prefill path does). Portable C vector extensions,
run as a tinygrad PROGRAM (workers/c_kernel.py); shapes are compile-time constants.
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.renderer import Estimates

from workers.c_kernel import c_kernel
from workers.cpu_matvec import BLOCK_BYTES, DEQUANT_BLOCK, VECTOR_TYPES, WEIGHT_PARAMS

GEMM_MIN_ROWS = 4  # MR: with fewer rows cpu_matvec is faster (measured: docs/BENCHMARKS.md)

_SOURCE = """#define T {rows}
#define N {cols}
#define K {k}
#define KB (K / 32)
#define CORES {cores}
#define PER_CORE {per_core}
#define MR 4
#if defined(__AVX512F__)
#define NR 4
#else
#define NR 2
#endif

// out[t0 .. t0+mr, n0 .. n0+nr] from the dequantised panel; MR x NR is the register tile, smaller at the edges
static inline void tile(float *restrict out, const float *restrict h, const float *restrict panel, int t0, int n0,
                        int mr, int nr) {{
#pragma clang fp reassociate(on)
  if (mr == MR && nr == NR) {{
    v16 acc[MR][NR];
    for (int i = 0; i < MR; i++) for (int j = 0; j < NR; j++) acc[i][j] = (v16){{0}};
    for (int c = 0; c < K; c += 16) {{
      v16 x[MR], w[NR];
      for (int i = 0; i < MR; i++) x[i] = *(const v16 *)(h + (long)(t0 + i) * K + c);
      for (int j = 0; j < NR; j++) w[j] = *(const v16 *)(panel + j * K + c);
      for (int i = 0; i < MR; i++) for (int j = 0; j < NR; j++) acc[i][j] += x[i] * w[j];
    }}
    for (int i = 0; i < MR; i++) for (int j = 0; j < NR; j++) out[(long)(t0 + i) * N + n0 + j] = lane_sum(acc[i][j]);
    return;
  }}
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++) {{
      v16 acc = (v16){{0}};
      for (int c = 0; c < K; c += 16) acc += *(const v16 *)(h + (long)(t0 + i) * K + c) * *(const v16 *)(panel + j * K + c);
      out[(long)(t0 + i) * N + n0 + j] = lane_sum(acc);
    }}
}}

void {name}(float *restrict out, const float *restrict h, {params}, int core_id) {{
  float panel[NR * K] __attribute__((aligned(64)));
  const int n_end = (core_id + 1) * PER_CORE < N ? (core_id + 1) * PER_CORE : N;
  for (int n0 = core_id * PER_CORE; n0 < n_end; n0 += NR) {{
    const int nr = n_end - n0 < NR ? n_end - n0 : NR;
    for (int j = 0; j < nr; j++) {{
      const int n = n0 + j;
      for (int b = 0; b < KB; b++) {{
{dequant}
        *(v16 *)(panel + j * K + b * 32) = w0;
        *(v16 *)(panel + j * K + b * 32 + 16) = w1;
      }}
    }}
    for (int t0 = 0; t0 < T; t0 += MR) tile(out, h, panel, t0, n0, T - t0 < MR ? T - t0 : MR, nr);
  }}
}}
"""


def _program(kind: str, rows: int, cols: int, k: int):
    cores = max(1, min(NUM_CPU_THREADS.value, cols))
    name = f"gemm_{kind.lower()}_{rows}_{cols}_{k}_c{cores}"
    source = VECTOR_TYPES + _SOURCE.format(name=name, rows=rows, cols=cols, k=k, cores=cores, per_core=-(-cols // cores),
                            params=WEIGHT_PARAMS[kind], dequant=DEQUANT_BLOCK[kind])
    weight_bytes = cols * k * BLOCK_BYTES[kind] // 32
    return c_kernel(name, source, cores, Estimates(ops=2 * rows * cols * k, lds=weight_bytes + 4 * rows * k,
                                                   mem=weight_bytes + 4 * rows * (k + cols)))


def cpu_gemm(h: Tensor, w) -> Tensor:
    """h [T, K] @ w.T for a workers.quantized_weight.DeviceWeight w [N, K] (c_kernels_support): [T, N] float32."""
    rows, k = h.shape
    out = Tensor.empty(rows, w.shape[0], dtype=dtypes.float32, device=h.device)
    return out.custom_kernel(h.float().contiguous(), *w.parts, fxn=_program(w.kind, rows, w.shape[0], k))[0]
