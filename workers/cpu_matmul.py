"""Matrix products for the CPU backend, as tinygrad custom kernels whose loops clang can vectorise.

tinygrad's CPU code is scalar C that relies on clang to vectorise it, and clang may only vectorise a sum if
it may reorder the additions. Two things stop it with tinygrad's own kernels: the C is compiled without
permission to reassociate, and the hand-coded optimisations unroll the reduction into one long dependent
chain of scalar adds. So on CPU:

- `use_cpu_kernels()` puts `#pragma clang fp reassociate(on)` in front of every clang kernel. It allows
  reordering of additions and multiplications only (no finite-math or no-NaN assumptions, so -inf masks
  still work); the on-disk kernel cache is keyed by the source text, so it never serves a kernel compiled
  without the pragma for one with it.
- `cpu_linear(h, w, max_fused_rows)` computes h @ w.T with one custom kernel per weight kind (float32, Q4_1,
  Q8_0): rows of the output outer, the reduction as a plain inner loop over the weight's contiguous bytes (which clang turns
  into vector FMAs), dequantising in the loop, and the rows of h upcast (up to 16 at a time) so each weight
  byte loaded serves many rows. The loop shape is fixed (`opts_to_apply`), not left to the heuristics.

Measured on this project's 2-vCPU Xeon (docs/BENCHMARKS.md): a [1536, 576] Q4_1 matvec went from ~1.1 ms to
~0.25 ms, and to ~20 GFLOP/s at 8-16 rows. Other backends keep tinygrad's kernels.
"""
from __future__ import annotations

from tinygrad import Device, Tensor, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.renderer.cstyle import ClangRenderer
from tinygrad.uop.ops import AxisType, KernelInfo, Ops, UOp

from workers.cpu_gemm import cpu_gemm
from workers.cpu_gemm import supports as supports_cpu_gemm
from workers.cpu_matvec import C_KERNEL_KINDS, cpu_matvec
from workers.env_flags import env_flag

REASSOCIATE_PRAGMA = "#pragma clang fp reassociate(on)\n"
CPU_KERNELS_ENV = "TINYVLLM_CPU_KERNELS"  # "0": tinygrad's own kernels on CPU too (for comparisons)
MAX_UPCAST_ROWS = 16  # accumulators per weight row; 16 fits the 32 AVX-512 registers with room for loads
FUSED_DEQUANT_MAX_ROWS = 16  # decode batches dequantise in the loop; prefill chunks use a scratch float32 weight


class ReassociatingClangRenderer(ClangRenderer):
    """tinygrad's clang renderer with REASSOCIATE_PRAGMA in front of every kernel. A subclass placed first in
    the CPU device's renderer list (not a patch of ClangRenderer): tinygrad pickles the renderer into its
    spawned compile workers, which then import this module and render with the pragma too."""

    def render_kernel(self, *args, **kwargs) -> str:
        return REASSOCIATE_PRAGMA + super().render_kernel(*args, **kwargs)


def use_cpu_kernels(device: str) -> bool:
    """Makes `device` render with ReassociatingClangRenderer if it is tinygrad's CPU backend with its default
    (clang) renderer; returns whether it does, i.e. whether cpu_linear should be used there. Off when
    TINYVLLM_CPU_KERNELS=0 or when another CPU renderer was chosen (DEV=CPU:LLVM, DEV=CPU:CLANG)."""
    if not env_flag(CPU_KERNELS_ENV, True):
        return False
    if not isinstance(device, str) or device.split(":")[0] != "CPU":
        return False
    dev = Device[device]
    if not isinstance(dev.renderer, ClangRenderer):
        return False
    if ReassociatingClangRenderer not in dev.renderers and type(dev.renderer) is dev.renderers[0]:
        dev.renderers = [ReassociatingClangRenderer, *dev.renderers]
    return isinstance(dev.renderer, ReassociatingClangRenderer)


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


def _q4_1_kernel(out: UOp, h: UOp, packed: UOp, d: UOp, m: UOp) -> UOp:
    # byte j of a 32-block holds element j in its low nibble and element j + 16 in its high one
    t, n = UOp.range(out.shape[0], 0), UOp.range(out.shape[1], 1)
    blk, j = UOp.range(packed.shape[1], 2, AxisType.REDUCE), UOp.range(16, 3, AxisType.REDUCE)
    q, scale, low = packed[n, blk, j], d[n, blk, 0], m[n, blk, 0]
    lo = (q & 15).cast(dtypes.float32) * scale + low
    hi = (q >> 4).cast(dtypes.float32) * scale + low
    acc = (lo * h[t, blk * 32 + j] + hi * h[t, blk * 32 + 16 + j]).reduce(blk, j, arg=Ops.ADD)
    return _finish(out, acc, t, n, "matmul_q4_1")


def _q8_0_kernel(out: UOp, h: UOp, q: UOp, d: UOp) -> UOp:
    t, n = UOp.range(out.shape[0], 0), UOp.range(out.shape[1], 1)
    blk, j = UOp.range(q.shape[1], 2, AxisType.REDUCE), UOp.range(32, 3, AxisType.REDUCE)
    acc = (q[n, blk, j].cast(dtypes.float32) * d[n, blk, 0] * h[t, blk * 32 + j]).reduce(blk, j, arg=Ops.ADD)
    return _finish(out, acc, t, n, "matmul_q8_0")


_KERNELS = {"F32": _f32_kernel, "Q4_1": _q4_1_kernel, "Q8_0": _q8_0_kernel}


def cpu_linear(h: Tensor, w, max_fused_rows: int) -> Tensor:
    """h [T, K] @ w.T for a workers.quantized_weight.DeviceWeight w [N, K]: [T, N] float32. Up to max_fused_rows
    rows the quantised weight is dequantised inside the matmul's loop; for more, dequantising it once into a
    scratch float32 buffer and running the float32 kernel is faster (the loop's integer work is per row)."""
    rows, cols = h.shape[0], w.shape[0]
    if rows <= max_fused_rows and w.kind in C_KERNEL_KINDS:
        return cpu_matvec(h, w)
    if rows > max_fused_rows and supports_cpu_gemm(w):
        return cpu_gemm(h, w)
    kind, parts = (w.kind, w.parts) if rows <= max_fused_rows else ("F32", (w.dequantized().contiguous(),))
    out = Tensor.empty(rows, cols, dtype=dtypes.float32, device=h.device)
    return out.custom_kernel(h.float().contiguous(), *parts, fxn=_KERNELS[kind])[0]
