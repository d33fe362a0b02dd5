"""Matrix products for the CPU backend, as tinygrad custom kernels whose loops clang can vectorise.

tinygrad's CPU code is scalar C that relies on clang to vectorise it, and clang may only vectorise a sum if
it may reorder the additions. Two things stop it with tinygrad's own kernels: the C is compiled without
permission to reassociate, and the hand-coded optimisations unroll the reduction into one long dependent
chain of scalar adds. So on CPU:

- ReassociatingClangRenderer puts `#pragma clang fp reassociate(on)` in front of every clang kernel (the "c"
  kernel set installs it: workers/kernel_set.py). It allows reordering of additions and multiplications only
  (no finite-math or no-NaN assumptions, so -inf masks still work); the on-disk kernel cache is keyed by the
  source text, so it never serves a kernel compiled without the pragma for one with it.
- `cpu_linear(h, w)` computes h @ w.T: with the hand-written C kernels (workers/cpu_matvec.py,
  workers/cpu_gemm.py) for weights of whole 32-element blocks per row, which is every GGUF weight; otherwise
  (a float32 weight with an odd K) with a custom kernel: rows of the output outer, the reduction as a plain
  inner loop over the weight's contiguous row (which clang turns into vector FMAs), the rows of h upcast (up
  to 16 at a time), the output columns split across cores. The loop shape is fixed (`opts_to_apply`).

Measured on this project's 2-vCPU Xeon (docs/BENCHMARKS.md): kernels of this kind took a [1536, 576] Q4_1
matvec from ~1.1 ms to ~0.25 ms; the C kernels since then to ~0.1 ms. Other backends keep tinygrad's kernels.
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.renderer.cstyle import ClangRenderer
from tinygrad.uop.ops import AxisType, KernelInfo, Ops, UOp

from tinyvllm.workers.cpu_gemm import GEMM_MIN_ROWS, INT8_GEMM_MIN_ROWS, cpu_gemm, int8_tiles
from tinyvllm.workers.cpu_matvec import c_kernels_support, cpu_matvec, takes_int8

REASSOCIATE_PRAGMA = "#pragma clang fp reassociate(on)\n"
MAX_UPCAST_ROWS = 16  # accumulators per weight row; 16 fits the 32 AVX-512 registers with room for loads


class ReassociatingClangRenderer(ClangRenderer):
    """tinygrad's clang renderer with REASSOCIATE_PRAGMA in front of every kernel. A subclass placed first in
    the CPU device's renderer list (not a patch of ClangRenderer): tinygrad pickles the renderer into its
    spawned compile workers, which then import this module and render with the pragma too."""

    def render_kernel(self, *args, **kwargs) -> str:
        return REASSOCIATE_PRAGMA + super().render_kernel(*args, **kwargs)


def upcast_rows(rows: int) -> int:
    """The largest power of two up to MAX_UPCAST_ROWS that divides `rows`."""
    up = 1
    while up < MAX_UPCAST_ROWS and rows % (up * 2) == 0:
        up *= 2
    return up


def _finish(out: UOp, acc: UOp, t: UOp, n: UOp, name: str) -> UOp:
    rows, cols = out.shape
    up, threads = upcast_rows(rows), NUM_CPU_THREADS.value
    # split the output columns across cores (tinygrad's core_id; workers/cpu_graph.py runs the parts in parallel).
    # A size-1 range is dropped before the opts apply, so with one row the columns are axis 0.
    opts = ((Opt(OptOps.THREAD, 1 if rows > 1 else 0, threads),) if threads > 1 and cols % threads == 0 else ()) + \
        ((Opt(OptOps.UPCAST, 0, up),) if up > 1 else ())
    return out[t, n].store(acc).end(t, n).sink(arg=KernelInfo(name=f"{name}_{rows}_{cols}", opts_to_apply=opts))


def _f32_kernel(out: UOp, h: UOp, w: UOp) -> UOp:
    t, n, k = UOp.range(out.shape[0], 0), UOp.range(out.shape[1], 1), UOp.range(w.shape[1], 2, AxisType.REDUCE)
    return _finish(out, (h[t, k] * w[n, k]).reduce(k, arg=Ops.ADD), t, n, "matmul_f32")


def shared_int8_tiles(h: Tensor, weights: tuple, int8_activations: bool) -> Tensor | None:
    """int8_tiles(h) when more than one of `weights` would quantise h for gemm_i8 (q, k and v; gate and up), for
    cpu_linear's `tiles`; else None."""
    gemm_i8 = [w for w in weights if c_kernels_support(w) and takes_int8(w, int8_activations)
               and h.shape[0] >= INT8_GEMM_MIN_ROWS[w.kind]]
    return int8_tiles(h) if len(gemm_i8) > 1 else None


def cpu_linear(h: Tensor, w, int8_activations: bool = False, tiles: Tensor | None = None) -> Tensor:
    """h [T, K] @ w.T for a workers.quantized_weight.DeviceWeight w [N, K]: [T, N] float32. Weights of whole
    32-blocks per row (every quantised weight) take the C kernels: workers/cpu_matvec.py for a few rows,
    workers/cpu_gemm.py for more. Others (float32 with an odd K) take the tinygrad kernel above. int8_activations:
    see cpu_matvec; tiles: shared_int8_tiles(h, ...)."""
    if c_kernels_support(w):
        gemm_from = INT8_GEMM_MIN_ROWS[w.kind] if takes_int8(w, int8_activations) else GEMM_MIN_ROWS
        return cpu_matvec(h, w, int8_activations) if h.shape[0] < gemm_from else cpu_gemm(h, w, int8_activations, tiles)
    assert w.kind == "F32", w  # quantised rows are whole blocks
    out = Tensor.empty(h.shape[0], w.shape[0], dtype=dtypes.float32, device=h.device)
    return out.custom_kernel(h.float().contiguous(), w.parts[0], fxn=_f32_kernel)[0]
