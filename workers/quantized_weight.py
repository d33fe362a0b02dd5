"""GGUF weights kept in their quantised block form, dequantised inside the kernels that read them.

Host side, `QuantizedArray` is a 2-D GGUF tensor's raw blocks (read from the mapped file, not dequantised);
it behaves as a float32 array where one is asked for (`np.asarray` dequantises it with workers/gguf_dequantize.py).

Device side, `DeviceWeight` holds a weight's Tensors (`parts`) and returns `dequantized()`: the float32
[N, K] weight as a *lazy* expression, so `h @ w.dequantized().T` reads the quantised bytes and tinygrad fuses
the dequantisation into the matmul kernel's loads. `rows(idx)` dequantises only gathered rows (embeddings).

Device kinds and their layout (d, m: a block's scale and min: the file's float16 where it stores one per block, widened
in the kernels; float32 for the products of a super-block's scale and a sub-block's):
    Q4_0: packed nibbles uint8 [N, K/32, 16], d float16 [N, K/32, 1]; value = q * d - 8 d (the file's bytes)
    Q4_1: Q4_0's nibbles, d and m float16 [N, K/32, 1]; value = q * d + m (the file's bytes)
          (in each 32-block, byte j holds element j in its low nibble and element j+16 in its high one)
    Q8_0: int8 [N, K/32, 32], d float16 [N, K/32, 1] (float32 from IQ4_XS); value = q * d
    Q8_16: int8 [N, K/32, 32], d and m float32 [N, K/32, 2] (one per 16 elements); value = q * d + m
    Q4_K: Q4_1's nibbles [N, K/32, 16], each 32-block's 6-bit scale and minimum codes uint8 [N, K/32, 2] and each
          256-element super-block's d and dmin float32 [N, K/256, 2]; value = q * (d x scale) - dmin x minimum
    Q5_K: Q4_K's parts and, after the nibbles, each super-block's fifth bits as the file has them, uint8
          [N, K/256, 32] (bit j of byte e: element e of 32-block j's); value = (q + 16 x fifth bit) * (d x scale)
          - dmin x minimum
    Q6_K: the file's bytes: each super-block's low 4 bits of the 6-bit codes uint8 [N, K/32, 16] (128 bytes per
          super-block: 64 per 128-element half, byte e of which holds element e % 32 of the half's 32-block
          e // 32 in its low nibble and of 32-block 2 + e // 32 in its high one) and their high 2 bits uint8
          [N, K/32, 8] (64 bytes per super-block: byte e of its half's 32 holds element e of the half's 32-blocks
          0..3, two bits each, lowest first), its signed 8-bit scales per 16 elements int8 [N, K/32, 2] and d
          float32 [N, K/256, 1]; value = (code - 32) * (d x scale)
    Q6_K32: Q6_K on a GPU (`words=True`), its codes regrouped per 32-block: low nibbles in Q4_1's order uint8
          [N, K/32, 16], high 2 bits uint8 [N, K/32, 8] (byte j: elements j, j + 8, j + 16, j + 24, lowest first),
          the scales and d as Q6_K's; the same values, each 32-block's bytes by themselves (workers/gpu_gemm.py,
          workers/gpu_matvec.py)
    Q5_K32: Q5_K on a GPU, its fifth bits regrouped per 32-block uint8 [N, K/32, 4] (bit j of byte i: element
          4j + i), the rest as Q5_K's
    Q3_K: the file's bytes: each super-block's 2-bit codes uint8 [N, K/32, 8] (64 bytes per super-block: byte e of
          its half h holds elements e of 32-blocks 4h..4h+3, two bits each, lowest first) and third bits uint8
          [N, K/256, 32] (bit j of byte e: element e of 32-block j's, as Q5_K's fifth bits), its 16 six-bit scales
          minus 32 as int8 [N, K/32, 2] and d float32 [N, K/256, 1]; value = (2-bit code + 4 x third bit - 4) *
          (d x scale)
    Q2_K: the file's bytes: 2-bit codes uint8 [N, K/32, 8] as Q3_K's, one byte per 16 elements uint8 [N, K/32, 2]
          (a 4-bit scale code, the minimum's above it) and each super-block's d and dmin float32 [N, K/256, 2];
          value = code * (d x scale) - dmin x minimum
    F16:  float16 [N, K] (a 2-D float16 host array), widened in the kernel: half the bytes a step reads
    BF16: bfloat16's bits as uint16 [N, K] (a GGUF or safetensors BF16 matrix), widened in the kernel
    F8_E4M3: float8 e4m3 codes uint8 [N, K/32, 32], d float32 [N, K/32, 1]; value = fp8(q) * d (a safetensors
          FP8 checkpoint's codes, its per-tensor, per-channel or block scales as one scale per 32-block:
          workers/fp8_checkpoint.py)
For the GPU kernels (workers/gpu_matvec.py) F16 and Q8_0 keep their values as the same bytes in uint32 words,
[N, K/32, words per block] (`words=True`): tinygrad folds only 32-bit loads into vector loads, and reinterpreting
int8 as uint32 inside a traced step would copy the weight every step. Dequantising words takes bytes apart with
shifts, which fuse into the kernel that reads them.
Other GGUF types are repacked into one of those kinds when they go to the device (`DEVICE_KIND`), one tensor at a
time, with the same values (every product involved is exact in float32, so only a zero's sign may differ):
    Q5_0 -> Q8_0: codes q - 16;  IQ4_NL -> Q8_0: codes from the non-linear table, d
    IQ4_XS -> Q8_0: codes from the table, each 32-element sub-block's d = super d x (6-bit scale - 32)
    Q5_1 -> Q8_16: codes, d and m (each twice)
Q2_K, Q3_K, Q4_K, Q5_K and Q6_K keep the file's scales: their codes (Q2_K's, Q3_K's and Q6_K's as the file has them;
Q4_K's and Q5_K's nibbles reordered from the super-block's 64-element chunks to Q4_1's order, Q5_K's fifth bits beside
them) with the sub-blocks' scale codes, the products with the super-block's d taken inside the kernels, as the
repacked types' d are, in float32. On the device Q2_K takes 2.75 bits a value (the file 2.6), Q3_K 3.6 (the file
3.4), Q4_K 4.75 (the file 4.5), Q5_K 5.75 (the file 5.5), Q6_K 6.6 (the file 6.56), Q4_0 4.5, Q4_1 5, Q8_0 8.5,
Q5_0 and IQ4_NL 8.5, IQ4_XS 9 and Q5_1 12 (where the file has 6);
F32 is a float32 "F32" weight (the other GGUF types are refused, naming them). The dequantisation computes what
workers/gguf_dequantize.py's numpy does, in the same order, in float32.
"""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor, dtypes

from tinyvllm.protocol.gguf_file import GGML_TYPE_IDS, GGML_TYPES
from tinyvllm.workers.device_input import device_tensor
from tinyvllm.workers.gguf_dequantize import (IQ4_VALUES, dequantize, f16_field, iq4_xs_scales, k_quant_values,
                                              k_scales_mins, nibbles, q3_k_scale_codes, q5_codes, q6_k_values)
from tinyvllm.workers.kv_quant import decode as kv_decode

# the kinds the kernels multiply (and F16, F32)
IN_KERNEL_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q8_16", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "BF16", "F8_E4M3")
DEVICE_KIND = {"Q4_1": "Q4_1", "Q4_0": "Q4_0", "Q4_K": "Q4_K",  # the types kept compact, and as which kind
               "Q8_0": "Q8_0", "Q5_0": "Q8_0", "IQ4_NL": "Q8_0", "IQ4_XS": "Q8_0",
               "Q6_K": "Q6_K", "Q5_K": "Q5_K", "Q5_1": "Q8_16", "Q2_K": "Q2_K", "Q3_K": "Q3_K",
               "BF16": "BF16", "F8_E4M3": "F8_E4M3"}
# F8_E4M3 is no GGUF type: the blocks a safetensors FP8 matrix is packed into (workers/fp8_checkpoint.py), 32 codes
# after their float32 scale
BLOCK_LAYOUT = {**{name: (elems, size) for name, elems, size in GGML_TYPES.values()}, "F8_E4M3": (32, 36)}


def _e4m3_values() -> np.ndarray:
    """float8 e4m3fn's 256 codes as float32 (0x7F and 0xFF: NaN)."""
    codes = np.arange(256)
    exponent, mantissa = (codes >> 3) & 15, (codes & 7).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0 ** -6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    magnitude[(codes & 0x7F) == 0x7F] = np.nan
    return np.where(codes >> 7, -magnitude, magnitude).astype(np.float32)


E4M3_VALUES = _e4m3_values()


def _host_dequantize(type_name: str, blocks: np.ndarray) -> np.ndarray:
    """[N, blocks, bytes] -> float32 [N, K]."""
    if type_name == "F8_E4M3":
        return (E4M3_VALUES[blocks[:, :, 4:]] * _f8_scales(blocks)).reshape(blocks.shape[0], -1)
    n_elements = blocks.shape[0] * blocks.shape[1] * BLOCK_LAYOUT[type_name][0]
    flat = dequantize(np.ascontiguousarray(blocks).reshape(-1), GGML_TYPE_IDS[type_name], n_elements)
    return flat.reshape(blocks.shape[0], -1)


def _f8_scales(blocks: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, :, :4]).view(np.float32)


class QuantizedArray:
    """A 2-D tensor of a type in DEVICE_KIND (a GGUF type, or a checkpoint's BF16 or F8_E4M3) as its raw blocks
    [N, K/block_elems, block_bytes] (uint8), as stored (a view of the mapped file: repacked only on the way to the
    device).

    Array-like: `shape`, `dtype` (float32, what it dequantises to) and `np.asarray(x)` (the dequantised array)."""

    dtype = np.dtype(np.float32)
    ndim = 2

    def __init__(self, type_name: str, blocks: np.ndarray):
        if type_name not in DEVICE_KIND:
            raise ValueError(f"{type_name} is not kept quantised (kept: {', '.join(DEVICE_KIND)})")
        self.type_name, self.blocks = type_name, blocks
        self.block_elems, block_bytes = BLOCK_LAYOUT[type_name]
        assert blocks.ndim == 3 and blocks.shape[2] == block_bytes and blocks.dtype == np.uint8, blocks.shape
        self.shape = (blocks.shape[0], blocks.shape[1] * self.block_elems)

    @property
    def kind(self) -> str:
        """The device kind it is multiplied as (IN_KERNEL_TYPES; a GPU holds Q5_K and Q6_K as BLOCKWISE says)."""
        return DEVICE_KIND[self.type_name]

    @classmethod
    def from_raw(cls, type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> "QuantizedArray":
        block_elems, block_bytes = BLOCK_LAYOUT[type_name]
        return cls(type_name, np.asarray(raw).reshape(shape[0], shape[1] // block_elems, block_bytes))

    @staticmethod
    def keeps(type_name: str, shape: tuple[int, ...]) -> bool:
        """Whether a GGUF tensor of this type and shape stays quantised (2-D, whole blocks per row)."""
        return type_name in DEVICE_KIND and len(shape) == 2 and shape[1] % BLOCK_LAYOUT[type_name][0] == 0

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    def with_rows(self, reorder) -> "QuantizedArray":
        """The same tensor with its rows reordered: `reorder` maps the [N, ...] blocks to reordered [N, ...] ones."""
        return QuantizedArray(self.type_name, np.ascontiguousarray(reorder(self.blocks)))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        dense = _host_dequantize(self.type_name, self.blocks)
        return dense if dtype is None else dense.astype(dtype)

    def device_parts(self) -> tuple[np.ndarray, ...]:
        """Its kind's host parts (see the module docstring)."""
        return _DEVICE_PARTS[self.type_name](self.blocks)

    def __repr__(self) -> str:
        return f"QuantizedArray({self.type_name}, shape={self.shape})"


class Fp8Matrix(QuantizedArray):
    """An F8_E4M3 matrix as a checkpoint stores it: its codes [N, K] (a view of the mapped file) and one float32
    scale per row and 32-element block [N, K/32]; packed into F8_E4M3 blocks only where something asks for them (a
    tensor-parallel split, np.asarray), so loading copies nothing on the host but the scales."""

    def __init__(self, codes: np.ndarray, d: np.ndarray):
        assert codes.ndim == 2 and codes.shape[1] % 32 == 0 and d.shape == (codes.shape[0], codes.shape[1] // 32)
        self.type_name, self.block_elems, self.shape = "F8_E4M3", 32, codes.shape
        self.codes, self.d = codes, np.ascontiguousarray(d, np.float32)

    @property
    def blocks(self) -> np.ndarray:
        return np.concatenate([self.d[..., None].view(np.uint8), self.codes.reshape(*self.d.shape, 32)], axis=2)

    def device_parts(self) -> tuple[np.ndarray, ...]:
        return self.codes.reshape(*self.d.shape, 32), self.d[..., None]


def is_f16_matrix(array) -> bool:
    """A GGUF F16 matrix, which load_weights keeps as float16 (workers/weights.py) and the device keeps too."""
    return isinstance(array, np.ndarray) and array.dtype == np.float16 and array.ndim == 2


def _is_float_matrix(array) -> bool:
    if isinstance(array, QuantizedArray):
        return array.type_name == "BF16"
    return isinstance(array, np.ndarray) and array.ndim == 2 and array.dtype.kind == "f"


def _narrowed(array, dtype: str):
    """A float matrix as float16 (numpy) or BF16 (a QuantizedArray of rounded-to-nearest-even bits)."""
    wide = np.asarray(array, np.float32)
    if dtype == "float16":
        return wide.astype(np.float16)
    bits = wide.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype("<u2")
    return QuantizedArray("BF16", rounded.view(np.uint8).reshape(*wide.shape, 2))


def _k_quant_parts(b: np.ndarray, five_bit: bool) -> tuple[np.ndarray, ...]:
    """Q4_K or Q5_K super-blocks [N, S, bytes] as their kind's parts: nibbles [N, 8S, 16] (Q4_1's order), Q5_K's
    fifth bits [N, S, 32] (the file's), 6-bit scale and minimum codes [N, 8S, 2], d and dmin float32 [N, S, 2]."""
    n, s = b.shape[:2]
    flat = b.reshape(n * s, -1)
    q, _, _ = k_quant_values(flat, five_bit)
    low = q & 15
    packed = low[..., :16] | (low[..., 16:] << 4)
    fifth = (np.ascontiguousarray(b[:, :, 16:48]),) if five_bit else ()
    scale_codes = np.stack(k_scales_mins(flat[:, 4:16]), axis=-1).astype(np.uint8)
    return (packed.reshape(n, s * 8, 16), *fifth, scale_codes.reshape(n, s * 8, 2),
            np.concatenate([f16_field(b, 0), f16_field(b, 2)], axis=-1))


def _q6_k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K super-blocks' scales int8 [N, 8S, 2] (one per 16 elements) and d float32 [N, S, 1], as the file has them."""
    n, s = b.shape[:2]
    return np.ascontiguousarray(b[:, :, 192:208]).view(np.int8).reshape(n, s * 8, 2), f16_field(b, 208)


def _q6_k_parts(b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Q6_K super-blocks [N, S, 210] as the Q6_K kind's parts: low nibbles [N, 8S, 16] and high bit pairs
    [N, 8S, 8] (the file's bytes), scales int8 [N, 8S, 2], d float32 [N, S, 1]."""
    n, s = b.shape[:2]
    return (np.ascontiguousarray(b[:, :, 0:128]).reshape(n, s * 8, 16),
            np.ascontiguousarray(b[:, :, 128:192]).reshape(n, s * 8, 8), *_q6_k_scales(b))


def _q6_k_block_parts(b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Q6_K super-blocks [N, S, 210] regrouped per 32-element block, the Q6_K32 kind's parts: low nibbles [N, 8S, 16]
    in Q4_1's order, high bit pairs [N, 8S, 8] (byte j: elements j, j + 8, j + 16 and j + 24, two bits each, lowest
    first), the file's scales int8 [N, 8S, 2] and d float32 [N, S, 1]."""
    n, s = b.shape[:2]
    codes = (q6_k_values(b.reshape(n * s, -1))[0].astype(np.int16) + 32).astype(np.uint8).reshape(n, s * 8, 32)
    low, high = codes & 15, codes >> 4
    pairs = high[..., 0:8] | (high[..., 8:16] << 2) | (high[..., 16:24] << 4) | (high[..., 24:32] << 6)
    return low[..., :16] | (low[..., 16:] << 4), pairs, *_q6_k_scales(b)


def _q5_k_block_parts(b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Q5_K super-blocks [N, S, 176] regrouped per 32-element block, the Q5_K32 kind's parts: Q5_K's nibbles [N, 8S, 16],
    each block's fifth bits [N, 8S, 4] (bit j of byte i: element 4j + i), Q5_K's codes [N, 8S, 2] and dm [N, S, 2]."""
    packed, fifth, codes, dm = _k_quant_parts(b, five_bit=True)
    n, s = fifth.shape[:2]
    bits = (fifth[:, :, None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [N, S, block, element]
    by_byte = bits.reshape(n, s * 8, 8, 4) << np.arange(8, dtype=np.uint8)[:, None]  # [.., bit j, byte i]
    return packed, np.bitwise_or.reduce(by_byte, axis=2).astype(np.uint8), codes, dm


def _q3_k_parts(b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Q3_K super-blocks [N, S, 110] as the Q3_K kind's parts: 2-bit codes [N, 8S, 8], third bits [N, S, 32] (both
    the file's bytes), scales minus 32 int8 [N, 8S, 2], d float32 [N, S, 1]."""
    n, s = b.shape[:2]
    return (np.ascontiguousarray(b[:, :, 32:96]).reshape(n, s * 8, 8), np.ascontiguousarray(b[:, :, 0:32]),
            q3_k_scale_codes(b.reshape(n * s, -1)).reshape(n, s * 8, 2), f16_field(b, 108))


def _q2_k_parts(b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Q2_K super-blocks [N, S, 84] as the Q2_K kind's parts: 2-bit codes [N, 8S, 8] and scale/minimum bytes
    [N, 8S, 2] (the file's), d and dmin float32 [N, S, 2]."""
    n, s = b.shape[:2]
    return (np.ascontiguousarray(b[:, :, 16:80]).reshape(n, s * 8, 8),
            np.ascontiguousarray(b[:, :, 0:16]).reshape(n, s * 8, 2),
            np.concatenate([f16_field(b, 80), f16_field(b, 82)], axis=-1))


def _iq4_xs_parts(b: np.ndarray) -> tuple[np.ndarray, ...]:
    n, s = b.shape[:2]
    codes = IQ4_VALUES[nibbles(b[:, :, 8:].reshape(n, s * 8, 16))]
    return codes, iq4_xs_scales(b.reshape(-1, b.shape[2])).reshape(n, s * 8, 1)


def _half_field(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of each block, as float16 [N, blocks, 1]: the kernels widen it."""
    return np.ascontiguousarray(blocks[..., start:start + 2]).view("<f2")


# a GGUF type's blocks [N, blocks, bytes] -> its kind's host parts (see the module docstring)
_DEVICE_PARTS = {
    "Q4_1": lambda b: (b[:, :, 4:], _half_field(b, 0), _half_field(b, 2)),
    "Q4_0": lambda b: (b[:, :, 2:], _half_field(b, 0)),
    "Q4_K": lambda b: _k_quant_parts(b, five_bit=False),
    "Q8_0": lambda b: (b[:, :, 2:].view(np.int8), _half_field(b, 0)),
    "Q5_0": lambda b: (q5_codes(b, 2).astype(np.int8) - np.int8(16), _half_field(b, 0)),
    "IQ4_NL": lambda b: (IQ4_VALUES[nibbles(b[:, :, 2:])], _half_field(b, 0)),
    "IQ4_XS": _iq4_xs_parts,
    "Q5_1": lambda b: (q5_codes(b, 4).astype(np.int8), np.repeat(f16_field(b, 0), 2, axis=-1),
                       np.repeat(f16_field(b, 2), 2, axis=-1)),
    "Q5_K": lambda b: _k_quant_parts(b, five_bit=True),
    "Q6_K": _q6_k_parts,
    "Q2_K": _q2_k_parts,
    "Q3_K": _q3_k_parts,
    "BF16": lambda b: (np.ascontiguousarray(b).view("<u2").reshape(b.shape[0], -1),),
    "F8_E4M3": lambda b: (b[:, :, 4:], _f8_scales(b)),
}


# the kinds a GPU holds regrouped per 32-element block (words=True), and as what
BLOCKWISE = {"Q5_K": ("Q5_K32", _q5_k_block_parts), "Q6_K": ("Q6_K32", _q6_k_block_parts)}
WORDS_PER_BLOCK = {"F16": 16, "Q8_0": 8}  # uint32 words of a 32-element block's values
# (not Q4_1: tinygrad 0.14 fails to schedule its nibble arithmetic on uint32 inside a traced layer function)


def _from_words(words: Tensor, bits: int) -> Tensor:
    """The `bits`-wide little-endian fields of uint32 words [..., W], as uint32: [..., W * 32 / bits]."""
    fields = Tensor.stack(*((words >> s) & ((1 << bits) - 1) for s in range(0, 32, bits)), dim=-1)
    return fields.reshape(*words.shape[:-1], -1)


def _nibbles(packed: Tensor) -> Tensor:
    """Q4_1's order [..., 16] bytes -> [..., 32] codes: byte j holds element j (low nibble) and element j + 16."""
    return Tensor.stack(packed & 15, packed >> 4, dim=2).reshape(*packed.shape[:-1], 32)


def _dequant_q4_1(packed: Tensor, d: Tensor, m: Tensor) -> Tensor:
    return _nibbles(packed).cast(dtypes.float32) * d.cast(dtypes.float32) + m.cast(dtypes.float32)


def _dequant_q4_0(packed: Tensor, d: Tensor) -> Tensor:
    return _dequant_q4_1(packed, d, d.cast(dtypes.float32) * -8)


def _dequant_q8_0(q: Tensor, d: Tensor) -> Tensor:
    if q.dtype == dtypes.uint32:
        q = _from_words(q, 8).cast(dtypes.uint8).bitcast(dtypes.int8)
    return q.cast(dtypes.float32) * d.cast(dtypes.float32)


def _widen_f16(w: Tensor) -> Tensor:
    if w.dtype == dtypes.uint32:
        w = _from_words(w, 16).cast(dtypes.uint16).bitcast(dtypes.half)
    return w.cast(dtypes.float32)


def _dequant_f8_e4m3(q: Tensor, d: Tensor) -> Tensor:
    return kv_decode(q, "fp8") * d  # the KV cache's e4m3 codes are the same format


def _dequant_q8_16(q: Tensor, d: Tensor, m: Tensor) -> Tensor:
    halves = q.reshape(*q.shape[:-1], 2, 16).cast(dtypes.float32)
    return (halves * d.unsqueeze(-1) + m.unsqueeze(-1)).reshape(q.shape)


def _per_block(super_blocks: Tensor, n_blocks: int) -> Tensor:
    """[N, K/256, F] -> each 32-block's copy of its super-block's fields: [N, K/32, F]."""
    n, s, f = super_blocks.shape
    return super_blocks.reshape(n, s, 1, f).expand(n, s, n_blocks // s, f).reshape(n, n_blocks, f)


def _dequant_q4_k(packed: Tensor, codes: Tensor, dm: Tensor) -> Tensor:
    dm, codes = _per_block(dm, packed.shape[1]), codes.cast(dtypes.float32)
    return _dequant_q4_1(packed, dm[..., 0:1] * codes[..., 0:1], -(dm[..., 1:2] * codes[..., 1:2]))


def _bits(b: Tensor, count: int, width: int) -> Tensor:
    """The `count` fields of `width` bits in each int32 byte of b [..., E], lowest first: [..., count, E]. By integer
    division: shifts of the uint8 bytes (or a float floor of them) met tinygrad 0.14 rewrite bugs inside a traced
    layer function, and a mask tensor would be a buffer it may not hold."""
    return Tensor.stack(*((b // (1 << (width * j))) % (1 << width) for j in range(count)), dim=-2)


def _five_bit_scaled(packed: Tensor, fifth_bits: Tensor, codes: Tensor, dm: Tensor) -> Tensor:
    """Q5_K's values from its nibbles and each element's fifth bit [N, K/32, 32]: (q + 16 x bit) * (d x scale) -
    dmin x minimum."""
    dm, codes = _per_block(dm, packed.shape[1]), codes.cast(dtypes.float32)
    q = _nibbles(packed).cast(dtypes.int32) + fifth_bits * 16
    return q.cast(dtypes.float32) * (dm[..., 0:1] * codes[..., 0:1]) - dm[..., 1:2] * codes[..., 1:2]


def _dequant_q5_k(packed: Tensor, fifth: Tensor, codes: Tensor, dm: Tensor) -> Tensor:
    b = fifth.cast(dtypes.int32)  # [N, S, 32]: bit j of byte e is element e of block j's
    return _five_bit_scaled(packed, _bits(b, 8, 1).reshape(*packed.shape[:-1], 32), codes, dm)


def _two_bit_codes(low: Tensor) -> Tensor:
    """Q2_K's and Q3_K's 2-bit codes (Q6_K's codes' high 2 bits) [N, K/32, 8] (each super-block's 64 bytes) -> int32
    [N, K/256, 2, 4, 32]."""
    n, blocks = low.shape[:2]
    return _bits(low.cast(dtypes.int32).reshape(n, blocks // 8, 2, 32), 4, 2)


def _dequant_q2_k(low: Tensor, codes: Tensor, dm: Tensor) -> Tensor:
    n, blocks = low.shape[:2]
    halves = _two_bit_codes(low).reshape(n, blocks, 2, 16).cast(dtypes.float32)
    codes, dm = codes.cast(dtypes.int32), _per_block(dm, blocks)
    scale = (dm[..., 0:1] * (codes % 16).cast(dtypes.float32)).unsqueeze(-1)
    minimum = (dm[..., 1:2] * (codes // 16).cast(dtypes.float32)).unsqueeze(-1)
    return (halves * scale - minimum).reshape(n, blocks, 32)


def _dequant_q3_k(low: Tensor, high: Tensor, scales: Tensor, d: Tensor) -> Tensor:
    n, blocks = low.shape[:2]
    third = _bits(high.cast(dtypes.int32), 8, 1).reshape(n, blocks // 8, 2, 4, 32)
    q = (_two_bit_codes(low) + third * 4 - 4).reshape(n, blocks, 32)
    return _half_scaled(q, scales, d)


def _dequant_q6_k(low: Tensor, high: Tensor, scales: Tensor, d: Tensor) -> Tensor:
    n, blocks = low.shape[:2]
    nibbles = _bits(low.cast(dtypes.int32).reshape(n, blocks // 8, 2, 64), 2, 4)  # [N, S, half, nibble, 64]
    pairs = _two_bit_codes(high)  # [N, S, half, block of the half, 32]
    q = nibbles.reshape(n, blocks, 32) + pairs.reshape(n, blocks, 32) * 16 - 32
    return _half_scaled(q, scales, d)


def _dequant_q5_k32(packed: Tensor, fifth: Tensor, codes: Tensor, dm: Tensor) -> Tensor:
    return _five_bit_scaled(packed, _bits(fifth.cast(dtypes.int32), 8, 1).reshape(*packed.shape[:-1], 32), codes, dm)


def _dequant_q6_k32(packed: Tensor, pairs: Tensor, scales: Tensor, d: Tensor) -> Tensor:
    high = _bits(pairs.cast(dtypes.int32), 4, 2).reshape(*packed.shape[:-1], 32)  # byte j: elements j, j + 8, ...
    return _half_scaled(_nibbles(packed).cast(dtypes.int32) + high * 16 - 32, scales, d)


def _half_scaled(q: Tensor, scales: Tensor, d: Tensor) -> Tensor:
    """Signed codes [N, K/32, 32] times d x their 16-element half's 8-bit scale."""
    halves = q.reshape(*q.shape[:-1], 2, 16).cast(dtypes.float32)
    return (halves * (_per_block(d, q.shape[1]) * scales.cast(dtypes.float32)).unsqueeze(-1)).reshape(q.shape)


_DEQUANT = {"Q4_0": _dequant_q4_0, "Q4_1": _dequant_q4_1, "Q2_K": _dequant_q2_k, "Q3_K": _dequant_q3_k, "Q4_K": _dequant_q4_k,
            "Q5_K": _dequant_q5_k, "Q6_K": _dequant_q6_k, "Q5_K32": _dequant_q5_k32, "Q6_K32": _dequant_q6_k32,
            "Q8_0": _dequant_q8_0, "Q8_16": _dequant_q8_16, "F16": _widen_f16,
            "BF16": lambda w: kv_decode(w, "bfloat16"), "F8_E4M3": _dequant_f8_e4m3}


class DeviceWeight:
    """A weight on the device. `kind` is "F32" (parts: the float32 tensor), "F16" or a device kind (IN_KERNEL_TYPES,
    or BLOCKWISE's Q5_K32 and Q6_K32 on a GPU).

    Only Tensors live in `parts` (and `kind` is a plain string) so a DeviceWeight can be passed straight
    into a tinygrad `function`: its Tensors become the function's arguments."""

    def __init__(self, kind: str, parts: tuple[Tensor, ...]):
        if kind != "F32" and kind not in _DEQUANT:
            raise ValueError(f"no device layout for {kind}")
        self.kind, self.parts = kind, tuple(parts)

    @classmethod
    def from_host(cls, array, dtype: str = "auto", words: bool = False) -> "DeviceWeight":
        """A realised device weight from a numpy array or a QuantizedArray (see host_parts)."""
        kind, parts = cls.host_parts(array, dtype, words)
        return cls(kind, tuple(device_tensor(p) for p in parts))

    @staticmethod
    def host_parts(array, dtype: str = "auto", words: bool = False) -> tuple[str, tuple[np.ndarray, ...]]:
        """(kind, the parts as host arrays) of a weight on the device. dtype (--dtype): "auto" keeps what the host
        holds (a 2-D float16 array stays float16, blocks stay blocks); "float32" widens any weight; "float16" or
        "bfloat16" store a float matrix (float32, float16 or BF16) in that width, quantised ones as they are.
        words: the values' part as uint32 words (see the module's docstring)."""
        if dtype in ("float16", "bfloat16") and _is_float_matrix(array):
            array = _narrowed(array, dtype)
        if is_f16_matrix(array) and dtype != "float32":
            if words and array.shape[1] % 32 == 0:
                array = np.ascontiguousarray(array).view(np.uint32).reshape(array.shape[0], -1, WORDS_PER_BLOCK["F16"])
            return "F16", (np.ascontiguousarray(array),)
        if not isinstance(array, QuantizedArray) or dtype == "float32":
            return "F32", (np.ascontiguousarray(np.asarray(array, dtype=np.float32)),)
        if words and array.kind in BLOCKWISE:  # the GPU's GEMM and matvec read each 32-block's codes by themselves
            kind, parts = BLOCKWISE[array.kind]
            return kind, tuple(np.ascontiguousarray(p) for p in parts(array.blocks))
        host = array.device_parts()
        if words and array.kind in WORDS_PER_BLOCK:
            host = (np.ascontiguousarray(host[0]).view(np.uint32),) + host[1:]
        return array.kind, tuple(np.ascontiguousarray(p) for p in host)

    @property
    def shape(self) -> tuple[int, int] | tuple[int]:
        first = self.parts[0].shape
        if self.kind == "F32" or len(first) == 2:  # F32, BF16, or F16 not in words
            return first
        return (first[0], first[1] * 32)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)

    def joins(self, other: DeviceWeight) -> bool:
        """Whether `other`'s rows can follow this weight's in one weight (concatenated): the same kind and layout."""
        return self.kind == other.kind and len(self.parts) == len(other.parts) and all(
            a.dtype == b.dtype and a.shape[1:] == b.shape[1:] for a, b in zip(self.parts, other.parts))

    @classmethod
    def concatenated(cls, weights: list[DeviceWeight]) -> DeviceWeight:
        """One realised weight holding the rows of `weights` (each joins the first) one after another: every part of
        every kind is a row's blocks, rows first."""
        return cls(weights[0].kind, tuple(Tensor.cat(*(w.parts[i] for w in weights)).contiguous().realize()
                                          for i in range(len(weights[0].parts))))

    def dequantized(self) -> Tensor:
        """The float32 weight, lazily: no kernel runs until something that uses it is realised."""
        if self.kind == "F32":
            return self.parts[0]
        return _DEQUANT[self.kind](*self.parts).reshape(self.shape)

    def rows(self, idx: Tensor) -> Tensor:
        """The float32 rows `idx` (of any shape S -> [*S, K]), dequantising only the gathered blocks."""
        if self.kind == "F32":
            return self.parts[0][idx]
        flat = idx.flatten()
        gathered = [p[flat].cast(p.dtype) for p in self.parts]  # a gather may widen an integer type
        return _DEQUANT[self.kind](*gathered).reshape(*idx.shape, self.shape[1])

    def __repr__(self) -> str:
        return f"DeviceWeight({self.kind}, shape={self.shape}, {self.nbytes} bytes)"
