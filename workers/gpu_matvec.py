"""Decode matvecs for GPUs: h [T, K] @ w.T for a few rows of h and a quantised or float16 weight, dequantised in
the kernel, as tinygrad custom kernels with the matvec layout applied explicitly.

tinygrad's heuristics give a reduction its matvec layout (a group of threads per output row, rows upcast, rows
spread over local threads) only when the product's two sources are plain loads. A weight that is widened
(float16) or scaled (Q8_0, Q4_1) is not, so its decode matvecs got the generic layout: on an H200 a
Llama-3-8B-shaped Q8_0 batch-1 step took 197 ms (46 GB/s of weights), with these kernels 19 ms (476 GB/s;
docs/BENCHMARKS.md). Here the same
arithmetic as workers/quantized_weight.py's dequantisation (value = q * d (+ m), float32) is one reduction over
each 32-element block, with the layout given (`opts_to_apply`). Devices without local memory (the CPU) keep
tinygrad's own path.
"""
from __future__ import annotations

import functools

from tinygrad import Device, Tensor, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.helpers import getenv
from tinygrad.uop.ops import AxisType, KernelInfo, Ops, UOp

GPU_MATVEC_MAX_ROWS = 4  # rows of h (decode batch) this layout is for
THREADS_PER_ROW = max(1, getenv("TV_MV_THREADS", 8))  # threads sharing one output's reduction (a GROUP)
ROWS_PER_THREAD = getenv("TV_MV_ROWS", 4)  # outputs each thread accumulates (an UPCAST)
LOCAL_ROWS = getenv("TV_MV_LOCAL", 4)  # output rows per workgroup (a LOCAL)
# (unrolling each thread's 32-element block as well measured no faster on an H200: 6.4 vs 6.3 ms a 1B step)


def group_threads(blocks: int) -> int:
    """Threads per output row: THREADS_PER_ROW, halved until it divides the row's blocks (1: no group; tinygrad
    loops forever on a group of one)."""
    threads = THREADS_PER_ROW
    while blocks % threads:
        threads //= 2
    return threads


def _weight_value(kind: str, parts: tuple[UOp, ...], n: UOp, kb: UOp, e: UOp) -> UOp:
    """Element (n, kb * 32 + e) of the weight, as float32."""
    if kind == "F16":
        return parts[0][n, kb * 32 + e].cast(dtypes.float32)
    if kind == "Q8_0":
        q, d = parts
        return q[n, kb, e].cast(dtypes.float32) * d[n, kb, 0]
    packed, d, m = parts  # Q4_1: byte j holds element j (low nibble) and element j + 16 (high nibble)
    byte = packed[n, kb, e % 16]
    nibble = (e < 16).where(byte & 15, byte >> 4)
    return nibble.cast(dtypes.float32) * d[n, kb, 0] + m[n, kb, 0]


def _kernel(kind: str, layout: bool, out: UOp, h: UOp, *parts: UOp) -> UOp:
    rows, cols = out.shape
    t, n = UOp.range(rows, 0), UOp.range(cols, 1)
    kb, e = UOp.range(h.shape[1] // 32, 2, AxisType.REDUCE), UOp.range(32, 3, AxisType.REDUCE)
    acc = (h[t, kb * 32 + e] * _weight_value(kind, parts, n, kb, e)).reduce(kb, e, arg=Ops.ADD)
    col_axis = 1 if rows > 1 else 0  # a size-1 range is dropped before the opts apply
    threads = group_threads(h.shape[1] // 32)
    opts = ((Opt(OptOps.GROUP, 0, threads),) if threads > 1 else ()) + (Opt(OptOps.LOCAL, col_axis, LOCAL_ROWS),
                                                                      Opt(OptOps.UPCAST, col_axis, ROWS_PER_THREAD))
    return out[t, n].store(acc).end(t, n).sink(arg=KernelInfo(name=f"matvec_{kind.lower()}_{rows}_{cols}_{h.shape[1]}",
                                                               opts_to_apply=opts if layout else ()))


def gpu_matvec_device(device: str) -> bool:
    """Whether models on `device` take these kernels: one with local memory (not the CPU); TV_GPU_MATVEC=0 says no."""
    renderer = Device[device].renderer
    return getenv("TV_GPU_MATVEC", 1) != 0 and renderer.has_local and renderer.has_shared


def gpu_matvec_fits(h: Tensor, w) -> bool:
    """Whether h @ w.T suits the kernel: a few rows, a weight widened or dequantised in the kernel, whole 32-element
    blocks per row and output rows that fill the layout's workgroups."""
    return w.kind in ("F16", "Q8_0", "Q4_1") and h.shape[0] <= GPU_MATVEC_MAX_ROWS and w.shape[1] % 32 == 0 \
        and w.shape[0] % (LOCAL_ROWS * ROWS_PER_THREAD) == 0


def gpu_matvec(h: Tensor, w, layout: bool = True) -> Tensor:
    """h [T, K] @ w.T for a workers.quantized_weight.DeviceWeight w [N, K] (see gpu_matvec_fits): [T, N] float32.
    layout=False: the same kernel without the GPU layout, for a device without local memory (the CPU tests)."""
    out = Tensor.empty(h.shape[0], w.shape[0], dtype=dtypes.float32, device=h.device)
    kernel = functools.partial(_kernel, w.kind, layout)
    return out.custom_kernel(h.float().contiguous(), *w.parts, fxn=kernel)[0]
