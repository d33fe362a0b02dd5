"""Decode matvecs for GPUs: h [T, K] @ w.T for a few rows of h and a quantised or float16 weight, dequantised in
the kernel, as tinygrad custom kernels with the matvec layout applied explicitly.

tinygrad's heuristics give a reduction its matvec layout (a group of threads per output row, rows upcast, rows
spread over local threads) only when the product's two sources are plain loads. A weight that is widened
(float16) or scaled (Q8_0, Q4_1, Q4_K, Q5_K, Q6_K) is not, so its decode matvecs got the generic layout: on an H200 a
Llama-3-8B-shaped Q8_0 batch-1 step took 197 ms, with the layout 19 ms (docs/BENCHMARKS.md). Each thread also
reads a whole 32-element block per iteration from the weight's uint32 words (DeviceWeight.from_host(words=True)),
which tinygrad folds into 16-byte vector loads (int8 weights were read a byte per instruction). The arithmetic is
workers/quantized_weight.py's dequantisation (value = q * d (+ m), float32), with the scales applied once per
block. Devices without local memory (the CPU) keep tinygrad's own path.
"""
from __future__ import annotations

import functools

from tinygrad import Device, Tensor, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.uop.ops import AxisType, KernelInfo, Ops, UOp

from tinyvllm.protocol.kernel_choice import MatvecLayout
from tinyvllm.workers.product_ends import AS_THEY_ARE, RowInput, loaded, row_transform_name, split_sources
from tinyvllm.workers.quantized_weight import WORDS_PER_BLOCK

GPU_MATVEC_MAX_ROWS = 4  # rows of h (decode batch) this layout is for
VALUES_PER_BLOCK = {**WORDS_PER_BLOCK, "Q4_0": 16, "Q4_1": 16, "Q4_K": 16, "Q5_K32": 16, "Q6_K32": 16}  # words, or nibbles


def group_threads(blocks: int, threads: int) -> int:
    """Threads per output row: `threads`, halved until it divides the row's blocks (1: no group; tinygrad loops
    forever on a group of one)."""
    while blocks % threads:
        threads //= 2
    return threads


def _tree_sum(terms: list[UOp]) -> UOp:
    while len(terms) > 1:  # pairwise: independent adds, not one chain of 32
        terms = [a + b for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms) - len(terms) % 2:]
    return terms[0]


def _block_product(kind: str, x: list[UOp], words: list[UOp], scales: list[UOp]) -> UOp:
    """sum_e x[e] * weight[e] over one 32-element block, from the block's words and scales."""
    f32 = dtypes.float32
    if kind == "F16":  # word j: elements 2j (low half) and 2j + 1
        halves = [(w >> s).cast(dtypes.uint16).bitcast(dtypes.half).cast(f32) for w in words for s in (0, 16)]
        return _tree_sum([a * b for a, b in zip(x, halves)])
    if kind == "Q8_0":  # word j: elements 4j .. 4j + 3, signed bytes
        values = [(w >> s).cast(dtypes.int8).cast(f32) for w in words for s in (0, 8, 16, 24)]
        return _tree_sum([a * b for a, b in zip(x, values)]) * scales[0]
    if kind == "Q6_K32":  # 16 nibble bytes (Q4_1's order), then 8 bytes of high pairs (byte i: elements i, i + 8, ...)
        low, pairs = words[:16], words[16:]
        codes = [((low[e % 16] >> (e // 16 * 4)) & 15).cast(dtypes.int32) +
                 ((pairs[e % 8] >> (e // 8 * 2)) & 3).cast(dtypes.int32) * 16 - 32 for e in range(32)]
        halves = [_tree_sum([a * c.cast(f32) for a, c in zip(x[i:i + 16], codes[i:i + 16])]) for i in (0, 16)]
        return halves[0] * scales[0] + halves[1] * scales[1]  # each 16 elements' d x scale
    # Q4_0, Q4_1, Q4_K and Q5_K32, bytes (not words): byte i holds element i (low nibble) and element i + 16 (high
    # nibble); Q5_K32 then 4 bytes of fifth bits (bit j of byte i: element 4j + i); value = q * d + m
    values = [(w & 15).cast(f32) for w in words[:16]] + [(w >> 4).cast(f32) for w in words[:16]]
    if kind == "Q5_K32":
        values = [v + ((words[16 + e % 4] >> (e // 4)) & 1).cast(f32) * 16 for e, v in enumerate(values)]
    nibbles = _tree_sum([a * b for a, b in zip(x, values)])
    return nibbles * scales[0] + _tree_sum(list(x)) * scales[1]


def _block_scales(kind: str, n: UOp, kb: UOp, scales: tuple[UOp, ...]) -> list[UOp]:
    """Row n's block kb's scale (and minimum) in float32: stored per block (Q4_0's minimum -8 d), or for Q4_K the
    super-block's d (dmin) times the block's 6-bit code, as workers/quantized_weight.py's dequantisation takes them."""
    if kind == "Q4_0":
        d = scales[0][n, kb, 0].cast(dtypes.float32)
        return [d, d * -8]
    if kind == "Q6_K32":  # after the high pairs: the scale codes per 16 elements and the super-block's d
        _, codes, d = scales
        return [d[n, kb // 8, 0] * codes[n, kb, i].cast(dtypes.float32) for i in (0, 1)]
    if kind not in ("Q4_K", "Q5_K32"):
        return [s[n, kb, 0].cast(dtypes.float32) for s in scales]
    codes, dm = scales[-2:]  # Q5_K32's fifth bits before them
    f32 = dtypes.float32
    return [dm[n, kb // 8, 0] * codes[n, kb, 0].cast(f32), -(dm[n, kb // 8, 1] * codes[n, kb, 1].cast(f32))]


def _kernel(kind: str, layout: MatvecLayout | None, K: int, rows_in: tuple[bool, bool], out: UOp, h: UOp,
            *srcs: UOp) -> UOp:
    (words, *scales), norm = split_sources(rows_in, srcs)
    rows, cols = out.shape
    t, n = UOp.range(rows, 0), UOp.range(cols, 1)
    blocks = K // 32
    kb = UOp.range(blocks, 2, AxisType.REDUCE)
    x = [loaded(h, t, kb * 32 + e, K, rows_in, norm) for e in range(32)]
    values = [words[n, kb, j] for j in range(VALUES_PER_BLOCK[kind])]
    if kind in ("Q5_K32", "Q6_K32"):  # the fifth bits' bytes, the high pairs' bytes
        values += [scales[0][n, kb, j] for j in range(scales[0].shape[-1])]
    block = _block_product(kind, x, values, _block_scales(kind, n, kb, scales))
    acc = block.reduce(kb, arg=Ops.ADD)
    opts: tuple[Opt, ...] = ()
    if layout is not None:
        col_axis = 1 if rows > 1 else 0  # a size-1 range is dropped before the opts apply
        threads = group_threads(blocks, layout.threads)
        wanted = ((OptOps.GROUP, 0, threads), (OptOps.LOCAL, col_axis, layout.local), (OptOps.UPCAST, col_axis, layout.rows),
                  (OptOps.UPCAST, 0, rows))  # each thread all rows of h: the weight is read once, not once per row
        opts = tuple(Opt(op, axis, amount) for op, axis, amount in wanted if amount > 1)  # an opt of 1 is refused
    return out[t, n].store(acc).end(t, n).sink(arg=KernelInfo(name=f"matvec_{kind.lower()}_{rows}_{cols}_{K}{row_transform_name(rows_in)}",
                                                               opts_to_apply=opts))


def gpu_matvec_device(device: str) -> bool:
    """Whether `device` can run these kernels: one with local memory (not the CPU). Whether a model takes them is its
    KernelChoice's gpu_matvec (protocol/kernel_choice.py)."""
    renderer = Device[device].renderer
    return renderer.has_local and renderer.has_shared


def gpu_matvec_fits(h: Tensor, w, layout: MatvecLayout = MatvecLayout()) -> bool:
    """Whether h @ w.T suits the kernel: a few rows, a weight widened or dequantised in the kernel, whole 32-element
    blocks per row and output rows that fill the layout's workgroups."""
    values_fit = w.kind in VALUES_PER_BLOCK and (w.kind not in WORDS_PER_BLOCK or w.parts[0].dtype == dtypes.uint32)
    return values_fit and h.shape[0] <= GPU_MATVEC_MAX_ROWS and w.shape[1] % 32 == 0 \
        and w.shape[0] % (layout.local * layout.rows) == 0


def gpu_matvec(h: Tensor, w, layout: MatvecLayout | None = MatvecLayout(), rows_in: RowInput = AS_THEY_ARE) -> Tensor:
    """h [T, K] @ w.T for a workers.quantized_weight.DeviceWeight w [N, K] (see gpu_matvec_fits): [T, N] float32.
    layout=None: the same kernel without the GPU layout, for a device without local memory (the CPU tests).
    rows_in: h's RMSNorm or SwiGLU, applied as h is loaded (workers/product_ends.py)."""
    out = Tensor.empty(h.shape[0], w.shape[0], dtype=dtypes.float32, device=h.device)
    kernel = functools.partial(_kernel, w.kind, layout, w.shape[1], rows_in.flags())
    return out.custom_kernel(h.float(), *w.parts, *rows_in.sources(), fxn=kernel)[0]  # h as it is: see gpu_gemm
