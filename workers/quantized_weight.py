"""GGUF weights kept in their quantised block form, dequantised inside the kernels that read them.

Host side, `QuantizedArray` is a 2-D GGUF tensor's raw blocks (read from the mapped file, not dequantised);
it behaves as a float32 array where one is asked for (`np.asarray` dequantises it with workers/gguf_dequantize.py).

Device side, `DeviceWeight` holds a weight's Tensors (`parts`) and returns `dequantized()`: the float32
[N, K] weight as a *lazy* expression, so `h @ w.dequantized().T` reads the quantised bytes and tinygrad fuses
the dequantisation into the matmul kernel's loads. `rows(idx)` dequantises only gathered rows (embeddings).

In-kernel types and their device layout (d, m: the block's float16 scale and min, widened to float32 on load):
    Q4_1: packed nibbles uint8 [N, K/32, 16], d and m float32 [N, K/32, 1]; value = q * d + m
          (in each 32-block, byte j holds element j in its low nibble and element j+16 in its high one)
    Q8_0: int8 [N, K/32, 32], d float32 [N, K/32, 1]; value = q * d
    F16:  float16 [N, K] (a 2-D float16 host array), widened in the kernel: half the bytes a step reads
For the GPU kernels (workers/gpu_matvec.py) F16 and Q8_0 keep their values as the same bytes in uint32 words,
[N, K/32, words per block] (`words=True`): tinygrad folds only 32-bit loads into vector loads, and reinterpreting
int8 as uint32 inside a traced step would copy the weight every step. Dequantising words takes bytes apart with
shifts, which fuse into the kernel that reads them.
Any other type (F32, BF16, Q4_0, Q5_*, K-quants) is dequantised at load to a float32 "F32" weight.
The dequantisation computes what workers/gguf_dequantize.py's numpy does, in the same order, in float32.
"""
from __future__ import annotations

import numpy as np
from tinygrad import Tensor, dtypes

from tinyvllm.protocol.gguf_file import GGML_TYPE_IDS, GGML_TYPES
from tinyvllm.workers.device_input import device_tensor
from tinyvllm.workers.gguf_dequantize import dequantize

IN_KERNEL_TYPES = ("Q4_1", "Q8_0")


class QuantizedArray:
    """A 2-D GGUF tensor of an in-kernel type as its raw blocks [N, K/32, block_bytes] (uint8).

    Array-like: `shape`, `dtype` (float32, what it dequantises to) and `np.asarray(x)` (the dequantised array)."""

    dtype = np.dtype(np.float32)
    ndim = 2

    def __init__(self, type_name: str, blocks: np.ndarray):
        if type_name not in IN_KERNEL_TYPES:
            raise ValueError(f"{type_name} is not kept quantised (in-kernel types: {', '.join(IN_KERNEL_TYPES)})")
        self.type_name, self.blocks = type_name, blocks
        _, block_elems, block_bytes = GGML_TYPES[GGML_TYPE_IDS[type_name]]
        assert blocks.ndim == 3 and blocks.shape[2] == block_bytes and blocks.dtype == np.uint8, blocks.shape
        self.shape = (blocks.shape[0], blocks.shape[1] * block_elems)

    @classmethod
    def from_raw(cls, type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> "QuantizedArray":
        _, block_elems, block_bytes = GGML_TYPES[GGML_TYPE_IDS[type_name]]
        return cls(type_name, np.asarray(raw).reshape(shape[0], shape[1] // block_elems, block_bytes))

    @staticmethod
    def keeps(type_name: str, shape: tuple[int, ...]) -> bool:
        """Whether a GGUF tensor of this type and shape stays quantised (2-D, whole blocks per row)."""
        return type_name in IN_KERNEL_TYPES and len(shape) == 2 and shape[1] % 32 == 0

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    def with_rows(self, reorder) -> "QuantizedArray":
        """The same tensor with its rows reordered: `reorder` maps the [N, ...] blocks to reordered [N, ...] ones."""
        return QuantizedArray(self.type_name, np.ascontiguousarray(reorder(self.blocks)))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        flat = dequantize(np.ascontiguousarray(self.blocks).reshape(-1), GGML_TYPE_IDS[self.type_name], self.size)
        return flat.reshape(self.shape) if dtype is None else flat.reshape(self.shape).astype(dtype)

    def __repr__(self) -> str:
        return f"QuantizedArray({self.type_name}, shape={self.shape})"


def is_f16_matrix(array) -> bool:
    """A GGUF F16 matrix, which load_weights keeps as float16 (workers/weights.py) and the device keeps too."""
    return isinstance(array, np.ndarray) and array.dtype == np.float16 and array.ndim == 2


def _f16_field(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of each block, widened to float32: [N, K/32, 1] (exact)."""
    return np.ascontiguousarray(blocks[:, :, start:start + 2]).view("<f2").astype(np.float32)


WORDS_PER_BLOCK = {"F16": 16, "Q8_0": 8}  # uint32 words of a 32-element block's values
# (not Q4_1: tinygrad 0.14 fails to schedule its nibble arithmetic on uint32 inside a traced layer function)


def _from_words(words: Tensor, bits: int) -> Tensor:
    """The `bits`-wide little-endian fields of uint32 words [..., W], as uint32: [..., W * 32 / bits]."""
    fields = Tensor.stack(*((words >> s) & ((1 << bits) - 1) for s in range(0, 32, bits)), dim=-1)
    return fields.reshape(*words.shape[:-1], -1)


def _dequant_q4_1(packed: Tensor, d: Tensor, m: Tensor) -> Tensor:
    q = Tensor.stack(packed & 15, packed >> 4, dim=2).reshape(*packed.shape[:-1], 32)
    return q.cast(dtypes.float32) * d + m


def _dequant_q8_0(q: Tensor, d: Tensor) -> Tensor:
    if q.dtype == dtypes.uint32:
        q = _from_words(q, 8).cast(dtypes.uint8).bitcast(dtypes.int8)
    return q.cast(dtypes.float32) * d


def _widen_f16(w: Tensor) -> Tensor:
    if w.dtype == dtypes.uint32:
        w = _from_words(w, 16).cast(dtypes.uint16).bitcast(dtypes.half)
    return w.cast(dtypes.float32)


_DEQUANT = {"Q4_1": _dequant_q4_1, "Q8_0": _dequant_q8_0, "F16": _widen_f16}


class DeviceWeight:
    """A weight on the device. `kind` is "F32" (parts: the float32 tensor) or an in-kernel GGUF type.

    Only Tensors live in `parts` (and `kind` is a plain string) so a DeviceWeight can be passed straight
    into a tinygrad `function`: its Tensors become the function's arguments."""

    def __init__(self, kind: str, parts: tuple[Tensor, ...]):
        if kind != "F32" and kind not in _DEQUANT:
            raise ValueError(f"no device layout for {kind}")
        self.kind, self.parts = kind, tuple(parts)

    @classmethod
    def from_host(cls, array, dequantize_at_load: bool = False, words: bool = False) -> "DeviceWeight":
        """A realised device weight from a numpy array or a QuantizedArray (a 2-D float16 array stays float16).
        words: the values' part as uint32 words (see the module's docstring)."""
        if is_f16_matrix(array) and not dequantize_at_load:
            if words and array.shape[1] % 32 == 0:
                array = np.ascontiguousarray(array).view(np.uint32).reshape(array.shape[0], -1, WORDS_PER_BLOCK["F16"])
            return cls("F16", (device_tensor(array),))  # copied in through a writable host copy: mapped files are read-only
        if not isinstance(array, QuantizedArray) or dequantize_at_load:
            return cls("F32", (Tensor(np.ascontiguousarray(np.asarray(array), dtype=np.float32)).realize(),))
        b = array.blocks
        if array.type_name == "Q4_1":
            host = (b[:, :, 4:], _f16_field(b, 0), _f16_field(b, 2))
        else:  # Q8_0
            host = (b[:, :, 2:].view(np.int8), _f16_field(b, 0))
        if words and array.type_name in WORDS_PER_BLOCK:
            host = (np.ascontiguousarray(host[0]).view(np.uint32),) + host[1:]
        return cls(array.type_name, tuple(Tensor(np.ascontiguousarray(p)).realize() for p in host))

    @property
    def shape(self) -> tuple[int, int] | tuple[int]:
        first = self.parts[0].shape
        if self.kind == "F32" or len(first) == 2:  # F32, or F16 not in words
            return first
        return (first[0], first[1] * 32)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)

    def dequantized(self) -> Tensor:
        """The float32 weight, lazily: no kernel runs until something that uses it is realised."""
        if self.kind == "F32":
            return self.parts[0]
        return _DEQUANT[self.kind](*self.parts).reshape(self.shape)

    def rows(self, idx: Tensor) -> Tensor:
        """The float32 rows `idx` ([T] -> [T, K]), dequantising only the gathered blocks."""
        if self.kind == "F32":
            return self.parts[0][idx]
        gathered = [p[idx] for p in self.parts]
        gathered[0] = gathered[0].cast(self.parts[0].dtype)  # a gather may widen the integer type
        return _DEQUANT[self.kind](*gathered).reshape(idx.shape[0], self.shape[1])

    def __repr__(self) -> str:
        return f"DeviceWeight({self.kind}, shape={self.shape}, {self.nbytes} bytes)"
