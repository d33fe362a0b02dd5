"""Products of many rows (batched decode, prompt chunks) on tensor cores: h [T, K] @ w.T with half (or bfloat16)
inputs and float32 accumulation, the weight dequantised inside the kernel, so no step holds a dequantised copy of
any weight.

`gpu_gemm` is a tinygrad custom kernel for the kinds whose bytes it reads directly (F16 and Q8_0 in the GPU's uint32
words or as plain arrays, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K as a GPU holds them (Q5_K32, Q6_K32), BF16): each weight
element is the dequantisation of
workers/quantized_weight.py (value = q * d (+ m), in float32) rounded once to half (BF16 stays bfloat16, as
stored), multiplied by the row of h rounded to the same width (half saturated at +-65504, never inf) and summed in
float32 on the tensor cores (tinygrad's TC opt, applied explicitly: its heuristics try tensor cores only for one
reduce axis, and the element's byte and nibble fields split K into several). The tensor cores take K along the
weight's 32-element blocks, 16 at a time (a K that is not a multiple of 512 is padded to one); T and the weight's
rows are padded to the tile too. Where the device has no tensor core for the input width (bfloat16 before sm_80),
or K is under TENSOR_CORE_MIN_K, the same kernel runs under tinygrad's own opts, multiplying the rounded inputs in
float32.

The other quantised kinds (Q2_K, Q3_K, Q8_16, F8_E4M3) are dequantised into a half scratch of one
matrix, reused from layer to layer by the jit's memory planner (tests/workers/test_step_memory.py), which the same
kernel multiplies as an F16 weight (`half_scratch_product`); float32 weights stay float32 products.

Half inputs are what llama.cpp's CUDA backend gives cuBLAS for batches of quantised weights and what vLLM runs
everywhere (bf16/fp16): lossy against the float32 path, which devices without tensor cores (the CPU) keep. So on a
GPU the logits of a step of more than 4 rows (the output head too) come from half inputs, of fewer rows from the
float32 matvecs: a near-tie may be decided differently depending on how many requests share the step.
"""
from __future__ import annotations

import functools

from tinygrad import Device, Tensor, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.uop.ops import AxisType, KernelInfo, Ops, UOp

from tinyvllm.workers.kv_quant import HALF_MAX
from tinyvllm.workers.product_ends import AS_THEY_ARE, RowInput, loaded, row_transform_name, split_sources
from tinyvllm.workers.quantized_weight import DeviceWeight

GEMM_KINDS = ("F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K32", "Q6_K32", "BF16")
# the tensor-core opt on the blocks axis (the last reduce range: see _kernel), allowed to pad every axis (tc_opt 2)
TENSOR_CORE_OPT = Opt(OptOps.TC, 0, (-1, 2, 1))
TENSOR_CORE_MIN_K = 256  # 8 blocks, padded to the tensor cores' 16 (tinygrad 0.14 fails to pad 2 or 3 blocks)


def has_tensor_cores(device: str, dtype_in=dtypes.half) -> bool:
    """Whether `device` multiplies dtype_in inputs into float32 on tensor cores (tinygrad's renderer says so)."""
    return any(tc.dtype_in == dtype_in and tc.dtype_out == dtypes.float for tc in Device[device].renderer.tensor_cores)


def _input_dtype(kind: str):
    return dtypes.bfloat16 if kind == "BF16" else dtypes.half


def _element(kind: str, values: UOp, scales: tuple[UOp, ...], n: UOp, kb: UOp, e: UOp) -> UOp:
    """Element e of row n's 32-element block kb, in the product's input width."""
    f32 = dtypes.float32
    u32 = lambda x: x.cast(dtypes.uint32)  # noqa: E731
    words = values.dtype == dtypes.uint32
    if kind == "BF16":  # the stored bits [N, K]
        return values[n, kb * 32 + e].bitcast(dtypes.bfloat16)
    if kind == "F16":  # word j: elements 2j (low half) and 2j + 1
        if not words:
            return values[n, kb * 32 + e]
        return ((values[n, kb, e // 2] >> u32((e % 2) * 16)) & 0xFFFF).cast(dtypes.uint16).bitcast(dtypes.half)
    if kind == "Q8_0":  # word j: elements 4j .. 4j + 3, signed bytes
        q = ((values[n, kb, e // 4] >> u32((e % 4) * 8)) & 255).cast(dtypes.uint8).bitcast(dtypes.int8) if words \
            else values[n, kb, e]
        return (q.cast(f32) * scales[0][n, kb, 0].cast(f32)).cast(dtypes.half)
    # Q4_0, Q4_1, Q4_K, Q5_K32, Q6_K32: byte i of a block holds element i (low nibble) and element i + 16 (high one)
    q = ((values[n, kb, e % 16] >> (e // 16 * 4).cast(dtypes.uint8)) & 15).cast(f32)
    if kind == "Q6_K32":  # plus 16 x the high pair (byte i: elements i, i + 8, i + 16, i + 24), minus 32
        pairs, scale_codes, d = scales
        high = ((pairs[n, kb, e % 8] >> (e // 8 * 2).cast(dtypes.uint8)) & 3).cast(dtypes.int32)
        code = (q.cast(dtypes.int32) + high * 16 - 32).cast(f32)
        return (code * (d[n, kb // 8, 0] * scale_codes[n, kb, e // 16].cast(f32))).cast(dtypes.half)
    if kind == "Q5_K32":  # plus 16 x the fifth bit (bit j of byte i: element 4j + i)
        fifth, *scales = scales
        q = q + ((fifth[n, kb, e % 4] >> (e // 4).cast(dtypes.uint8)) & 1).cast(f32) * 16
    if kind in ("Q4_K", "Q5_K32"):  # the super-block's d and dmin times the block's 6-bit codes
        codes, dm = scales
        scale, minimum = dm[n, kb // 8, 0] * codes[n, kb, 0].cast(f32), -(dm[n, kb // 8, 1] * codes[n, kb, 1].cast(f32))
    else:
        scale = scales[0][n, kb, 0].cast(f32)
        minimum = scale * -8 if kind == "Q4_0" else scales[1][n, kb, 0].cast(f32)
    return (q * scale + minimum).cast(dtypes.half)


def _kernel(kind: str, tensor_cores: bool, K: int, rows_in: tuple[bool, bool], out: UOp, h: UOp, *srcs: UOp) -> UOp:
    (values, *scales), norm = split_sources(rows_in, srcs)
    rows, cols = out.shape
    t, n = UOp.range(rows, 0), UOp.range(cols, 1)
    e = UOp.range(32, 2, AxisType.REDUCE)
    kb = UOp.range(K // 32, 3, AxisType.REDUCE)  # the highest id: the tensor cores' K (their axis 0)
    x, width = loaded(h, t, kb * 32 + e, K, rows_in, norm), _input_dtype(kind)
    if width == dtypes.half:
        x = x.maximum(-HALF_MAX).minimum(HALF_MAX)
    x, w = x.cast(width), _element(kind, values, scales, n, kb, e)
    # on tensor cores a product of the narrow inputs summed in float32; elsewhere the same inputs multiplied in float32
    product = (x * w).cast(dtypes.float32) if tensor_cores else x.cast(dtypes.float32) * w.cast(dtypes.float32)
    acc = product.reduce(kb, e, arg=Ops.ADD)
    info = KernelInfo(name=f"gemm_{kind.lower()}_{rows}_{cols}_{K}{row_transform_name(rows_in)}",
                      opts_to_apply=(TENSOR_CORE_OPT,) if tensor_cores else None)  # else tinygrad's heuristics
    return out[t, n].store(acc).end(t, n).sink(arg=info)


def gpu_gemm_fits(h: Tensor, w: DeviceWeight, rows_in: RowInput = AS_THEY_ARE) -> bool:
    """Whether gpu_gemm reads w (a workers.quantized_weight.DeviceWeight) directly: its kind and whole 32-blocks."""
    return w.kind in GEMM_KINDS and w.shape[1] % 32 == 0 and rows_in.width(h) == w.shape[1]


def gpu_gemm(h: Tensor, w: DeviceWeight, tensor_cores: bool = True, rows_in: RowInput = AS_THEY_ARE) -> Tensor:
    """h [T, K] @ w.T for a DeviceWeight w [N, K] of GEMM_KINDS: [T, N] float32, summed in float32 from half (BF16:
    bfloat16) inputs. tensor_cores: whether the device has tensor cores for the input width (the caller knows: no
    device is asked while a step is traced); False: the same kernel under tinygrad's own opts. rows_in: h's RMSNorm
    or SwiGLU, applied as h is loaded (workers/product_ends.py)."""
    out = Tensor.empty(h.shape[0], w.shape[0], dtype=dtypes.float32, device=h.device)
    kernel = functools.partial(_kernel, w.kind, tensor_cores and w.shape[1] >= TENSOR_CORE_MIN_K, w.shape[1],
                               rows_in.flags())
    # h as it is (rounded to the input width inside): a .contiguous() here would copy a function's argument
    return out.custom_kernel(h.float(), *w.parts, *rows_in.sources(), fxn=kernel)[0]


def half_scratch_product(h: Tensor, w: DeviceWeight, tensor_cores: bool = True,
                         rows_in: RowInput = AS_THEY_ARE) -> Tensor:
    """h @ w.T through a half copy of the dequantised weight (w: any kind of whole 32-element blocks), which gpu_gemm
    multiplies as an F16 weight (rows_in: as gpu_gemm's)."""
    return gpu_gemm(h, DeviceWeight("F16", (w.dequantized().cast(dtypes.half).contiguous(),)), tensor_cores, rows_in)
