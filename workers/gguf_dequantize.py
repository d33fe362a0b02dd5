"""GGUF tensors to float32 numpy arrays: ggml's block formats dequantised in pure numpy."""
from __future__ import annotations

import numpy as np

from tinyvllm.protocol.gguf_file import GGML_TYPES, GGUFFile, bf16_to_float32


def dequantize_tensor(gguf: GGUFFile, name: str) -> np.ndarray:
    """One tensor as a fresh float32 array of shape `gguf.tensor_shape(name)`."""
    info = gguf.tensor_info(name)
    n = int(np.prod(info.shape, dtype=np.int64))
    return dequantize(np.asarray(gguf.raw(name)), info.ggml_type, n).reshape(info.shape)


# ---- dequantisation: each takes a (n_blocks, block_bytes) uint8 array and returns (n_blocks, block_elems) float32

def f16_field(blocks: np.ndarray, start: int) -> np.ndarray:
    """The little-endian float16 at byte `start` of each block ([..., block bytes]), as float32 [..., 1] (exact)."""
    return blocks[..., start:start + 2].view("<f2").astype(np.float32)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """Low nibbles first, then high nibbles, along the last axis (ggml's 4-bit order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4_0(b):
    return (nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)) * f16_field(b, 0)


def _q4_1(b):
    return nibbles(b[:, 4:]) * f16_field(b, 0) + f16_field(b, 2)


def q5_codes(b: np.ndarray, off: int) -> np.ndarray:
    """Q5_0/Q5_1 blocks [..., bytes] -> their 32 codes 0..31 (the 4 bytes at `off`: bit j is element j's fifth)."""
    high = np.unpackbits(np.ascontiguousarray(b[..., off:off + 4]), axis=-1, bitorder="little")
    return nibbles(b[..., off + 4:]) | (high << 4)


def _q5(b, has_min: bool):
    q = q5_codes(b, 4 if has_min else 2)
    if has_min:
        return q * f16_field(b, 0) + f16_field(b, 2)
    return (q.astype(np.int8) - np.int8(16)) * f16_field(b, 0)


def _q8_0(b):
    return b[:, 2:].view(np.int8) * f16_field(b, 0)


def k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12-byte field of Q4_K/Q5_K into 8 six-bit scales and 8 six-bit mins."""
    lo_sc, lo_mn, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo_sc & 63, (hi & 0x0F) | ((lo_sc >> 6) << 4)], axis=-1)
    mn = np.concatenate([lo_mn & 63, (hi >> 4) | ((lo_mn >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def k_quant_values(b: np.ndarray, five_bit: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K/Q5_K blocks [n, bytes] -> (codes [n, 8, 32] uint8, scale [n, 8], minimum [n, 8] float32): sub-block j's
    value = scale[j] * code - minimum[j]."""
    d, dmin = f16_field(b, 0), f16_field(b, 2)
    sc, mn = k_scales_mins(b[:, 4:16])
    qs = b[:, 48:176] if five_bit else b[:, 16:144]
    # 4 chunks of 32 bytes; each chunk's low nibbles form sub-block 2i and high nibbles sub-block 2i+1
    chunks = qs.reshape(-1, 4, 32)
    q = np.stack([chunks & 0x0F, chunks >> 4], axis=2).reshape(-1, 8, 32)
    if five_bit:  # bit i of qh[l] is the fifth bit of element l of sub-block i
        q = q | (np.unpackbits(b[:, 16:48, None], axis=-1, bitorder="little").transpose(0, 2, 1) << 4)
    return q, d * sc, dmin * mn


def _qk(b, five_bit: bool):
    q, scale, minimum = k_quant_values(b, five_bit)
    return (scale[:, :, None] * q - minimum[:, :, None]).reshape(-1, 256)


def q6_k_values(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K blocks [n, 210] -> (codes [n, 256] int8 in -32..31, scale [n, 16] float32 per 16 elements)."""
    ql, qh = b[:, 0:128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
    high = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=-1)
    q = (nibbles(ql) | (high << 4)).astype(np.int8) - np.int8(32)
    return q.reshape(-1, 256), f16_field(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32)


def _per_16(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray | None = None) -> np.ndarray:
    """Codes [n, 256] with a scale (and a minimum) per 16 elements [n, 16] -> their values, scale x code - minimum."""
    values = np.repeat(scale, 16, axis=-1) * q
    return values if minimum is None else values - np.repeat(minimum, 16, axis=-1)


def _two_bit_runs(qs: np.ndarray) -> np.ndarray:
    """Q2_K/Q3_K's 64 bytes of 2-bit codes [n, 64] -> [n, 256] uint8: each 128-element half's 32 bytes hold four
    32-element runs, two bits each, lowest first."""
    return ((qs.reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3).reshape(-1, 256)


def q2_k_values(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q2_K blocks [n, 84] -> (codes [n, 256] uint8 in 0..3, scale [n, 16], minimum [n, 16] float32 per 16 elements):
    value = scale * code - minimum."""
    return _two_bit_runs(b[:, 16:80]), f16_field(b, 80) * (b[:, 0:16] & 15), f16_field(b, 82) * (b[:, 0:16] >> 4)


def q3_k_scale_codes(b: np.ndarray) -> np.ndarray:
    """Q3_K blocks [n, 110] -> their 16 six-bit scales minus 32 [n, 16] int8 (per 16 elements; 12 bytes packed)."""
    lo, hi = b[:, 96:104], b[:, 104:108]
    sc = np.concatenate([(lo[:, :4] & 15) | ((hi & 3) << 4), (lo[:, 4:] & 15) | (((hi >> 2) & 3) << 4),
                         (lo[:, :4] >> 4) | (((hi >> 4) & 3) << 4), (lo[:, 4:] >> 4) | (((hi >> 6) & 3) << 4)], axis=-1)
    return sc.astype(np.int8) - np.int8(32)


def q3_k_values(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q3_K blocks [n, 110] -> (codes [n, 256] int8 in -4..3, scale [n, 16] float32 per 16 elements): two low bits as
    Q2_K's, minus 4 where the run's bit of hmask is clear; d x the 16 six-bit scales (minus 32)."""
    high = (b[:, None, None, 0:32] >> np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1)) & 1  # run h*4+j's bit
    q = _two_bit_runs(b[:, 32:96]).astype(np.int8) - np.int8(4) * (1 - high.reshape(-1, 256)).astype(np.int8)
    return q, f16_field(b, 108) * q3_k_scale_codes(b).astype(np.float32)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)  # IQ4_NL/XS


def _iq4_nl(b):
    return IQ4_VALUES[nibbles(b[:, 2:])].astype(np.float32) * f16_field(b, 0)


def iq4_xs_scales(b: np.ndarray) -> np.ndarray:
    """IQ4_XS blocks [n, 136] -> [n, 8] float32: each 32-element sub-block's d x (its 6-bit scale - 32), exact."""
    high = b[:, 2:4].copy().view("<u2").astype(np.int32) >> (2 * np.arange(8)) & 3
    low = np.stack([b[:, 4:8] & 15, b[:, 4:8] >> 4], axis=-1).reshape(-1, 8)
    return f16_field(b, 0) * ((low | (high << 4)) - 32).astype(np.float32)


def _iq4_xs(b):
    scales = iq4_xs_scales(b)
    values = IQ4_VALUES[nibbles(b[:, 8:].reshape(-1, 8, 16))].astype(np.float32)  # [n, 8, 32]
    return (scales[:, :, None] * values).reshape(-1, 256)


_PLAIN = {0: "<f4", 1: "<f2", 24: "i1", 25: "<i2", 26: "<i4", 27: "<i8", 28: "<f8"}
_QUANT = {2: _q4_0, 3: _q4_1, 6: lambda b: _q5(b, False), 7: lambda b: _q5(b, True), 8: _q8_0,
          10: lambda b: _per_16(*q2_k_values(b)), 11: lambda b: _per_16(*q3_k_values(b)),
          12: lambda b: _qk(b, False), 13: lambda b: _qk(b, True), 14: lambda b: _per_16(*q6_k_values(b)),
          20: _iq4_nl, 23: _iq4_xs}


SUPPORTED = sorted([*_PLAIN, 30, *_QUANT])  # the type ids read; any other is refused, naming it


def dequantize(data: np.ndarray, ggml_type: int, n_elements: int) -> np.ndarray:
    """Raw ggml bytes -> flat float32 array of `n_elements`."""
    if ggml_type in _PLAIN:
        return data.view(_PLAIN[ggml_type])[:n_elements].astype(np.float32)
    if ggml_type == 30:
        return bf16_to_float32(data.view("<u2")[:n_elements])
    if ggml_type not in _QUANT:
        name = GGML_TYPES.get(ggml_type, (f"id {ggml_type}",))[0]
        supported = ", ".join(GGML_TYPES[t][0] for t in SUPPORTED)
        raise ValueError(f"GGUF tensor type {name} is not supported (supported: {supported})")
    _, block_elems, block_bytes = GGML_TYPES[ggml_type]
    blocks = data[:n_elements // block_elems * block_bytes].reshape(-1, block_bytes)
    return _QUANT[ggml_type](blocks).astype(np.float32, copy=False).reshape(-1)
