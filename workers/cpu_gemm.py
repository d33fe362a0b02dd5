"""Matrix products of GEMM_MIN_ROWS or more rows (decode batches, prefill chunks) on the CPU backend, in C.

out[T, N] = h[T, K] @ w.T, w float32, Q4_1 or Q8_0. Each core takes its share of the output columns in panels
of NR weight rows: the panel is dequantised once into a small float32 buffer (L1-sized: NR x K floats), then
every tile of MR activation rows runs against it with MR x NR vector accumulators over K (each loaded value
feeds NR or MR multiply-adds). So a quantised weight is read once per product and never dequantised into a
float32 copy in memory. Portable C vector extensions (workers/c/gemm.c), run as a tinygrad PROGRAM
(workers/c_kernel.py); shapes are compile-time constants.
"""
from __future__ import annotations

from tinygrad import Tensor

from tinyvllm.workers.cpu_matvec import c_matmul

GEMM_MIN_ROWS = 4  # MR: with fewer rows cpu_matvec is faster (measured: docs/BENCHMARKS.md)


def cpu_gemm(h: Tensor, w) -> Tensor:
    """h [T, K] @ w.T (see workers/cpu_matvec.py's c_matmul), for GEMM_MIN_ROWS rows or more."""
    return c_matmul(h, w, "gemm")
