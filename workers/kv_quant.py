"""How each KV cache dtype (protocol/kv_cache_dtype.py) is stored, and the conversions to and from float32, as
tinygrad ops that run on every backend (the write kernel and tinygrad's attention use them; workers/c/attention.c
decodes the same formats in C).

- float32, float16: tinygrad's own dtypes; float16 saturated at +-65504 (HALF_MAX), never inf.
- bfloat16: the upper 16 bits of a float32 (rounded to nearest even), stored as uint16: tinygrad's CPU backend
  cannot compile __bf16, and the bits are the same on every backend.
- int8: round(x / scale), scale = absmax / 127.
- fp8: e4m3 (4 exponent bits, bias 7, 3 mantissa bits, no infinities; largest 448) codes in a uint8, of x / scale,
  scale = absmax / 448, encoded and decoded with integer bit operations.
Quantised dtypes keep one float32 scale per token per kv head (the absmax of its head_dim values): a block fills
token by token, and a per-token scale is exact under incremental writes.
"""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from tinyvllm.protocol.kv_cache_dtype import QUANTIZED_KV_DTYPES

STORAGE = {"float32": dtypes.float32, "float16": dtypes.float16, "bfloat16": dtypes.uint16, "int8": dtypes.int8,
           "fp8": dtypes.uint8}
CODE_MAX = {"int8": 127.0, "fp8": 448.0}
SCALE_DTYPE = dtypes.float32
E4M3_MAX_CODE = 0x7E  # 448; 0x7F is NaN


HALF_MAX = 65504.0  # float16's largest finite value


def storage_dtype(name: str) -> DType:
    return STORAGE[name]


def numpy_storage_dtype(name: str) -> np.dtype:
    return np.dtype(STORAGE[name].fmt)


def is_quantized(name: str) -> bool:
    return name in QUANTIZED_KV_DTYPES


def _encode_bfloat16(x: Tensor) -> Tensor:
    bits = x.float().bitcast(dtypes.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).cast(dtypes.uint16)


def _decode_bfloat16(codes: Tensor) -> Tensor:
    return (codes.cast(dtypes.uint32) << 16).bitcast(dtypes.float32)


def _encode_e4m3(x: Tensor) -> Tensor:
    """|x| <= 448 to the nearest e4m3 code (ties to even); below 2^-6 the subnormals, codes round(|x| * 2^9)."""
    magnitude = x.abs()
    bits = magnitude.bitcast(dtypes.uint32)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20).cast(dtypes.int32) - (120 << 3)
    subnormal = (magnitude * 512).round().cast(dtypes.int32)
    code = (magnitude < 2.0 ** -6).where(subnormal, normal).clip(0, E4M3_MAX_CODE)
    return ((x < 0).cast(dtypes.int32) * 0x80 + code).cast(dtypes.uint8)


def _decode_e4m3(codes: Tensor) -> Tensor:
    """(8 + m) * 2^(e - 10), the subnormals (e = 0) 2m * 2^-10: no float32 denormal on the way."""
    c = codes.cast(dtypes.int32)
    e, m = (c >> 3) & 15, c & 7
    mantissa = e.eq(0).where(m * 2, m + 8).cast(dtypes.float32)  # eq and <: elementwise on UOps too (in-kernel)
    magnitude = mantissa * ((e + 117) << 23).bitcast(dtypes.float32)
    return (c < 0x80).where(magnitude, -magnitude)


def encode(x: Tensor, name: str) -> Tensor:
    """float values (for a quantised dtype: already divided by their scale) -> the cache's storage."""
    if name == "bfloat16":
        return _encode_bfloat16(x)
    if name == "int8":
        return x.round().clip(-127, 127).cast(dtypes.int8)
    if name == "fp8":
        return _encode_e4m3(x)
    if name == "float16":  # saturated, not inf: an inf key or value would make every attention sum over it NaN
        return x.clip(-HALF_MAX, HALF_MAX).cast(dtypes.float16)
    return x.cast(STORAGE[name])


def decode(codes: Tensor, name: str) -> Tensor:
    """The cache's storage -> float32 (for a quantised dtype: before its scale)."""
    if name == "bfloat16":
        return _decode_bfloat16(codes)
    if name == "fp8":
        return _decode_e4m3(codes)
    return codes.cast(dtypes.float32)


def quantize(kv: Tensor, name: str) -> tuple[Tensor, Tensor | None]:
    """kv [..., head_dim] -> (codes [..., head_dim], scales [...] float32, or None for an unquantised dtype)."""
    if not is_quantized(name):
        return encode(kv, name), None
    kv = kv.float()
    scales = kv.abs().max(-1) / CODE_MAX[name]
    safe = (scales > 0).where(scales, 1.0)
    return encode(kv / safe.unsqueeze(-1), name), scales


def dequantize(codes: Tensor, scales: Tensor | None, name: str) -> Tensor:
    """codes [..., head_dim] with scales [...] (None: unquantised) -> float32."""
    values = decode(codes, name)
    return values if scales is None else values * scales.unsqueeze(-1)
