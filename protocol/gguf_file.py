"""Pure-numpy GGUF reader: header, metadata, tensor infos and dequantisation to float32.

The file is memory-mapped; nothing is read until `load()` asks for a tensor.
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""
from __future__ import annotations

import pathlib
import struct
from dataclasses import dataclass

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# metadata value type id -> struct format (scalars only; 8 = string, 9 = array)
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_SCALAR_DTYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
                  7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9

# ggml tensor type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}
GGML_TYPE_IDS = {name: type_id for type_id, (name, _, _) in GGML_TYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # row-major (numpy) order, i.e. GGUF dims reversed
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, (f"unknown({self.ggml_type})",))[0]


class _Cursor:
    """Sequential little-endian reader over a memoryview."""

    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.scalar("<I"), self.scalar("<Q")
            if item_type in _SCALAR_DTYPES:  # numeric arrays in one shot
                arr = np.frombuffer(self.buf, dtype=np.dtype(_SCALAR_DTYPES[item_type]).newbyteorder("<"),
                                    count=count, offset=self.pos)
                self.pos += arr.nbytes
                return arr.tolist()
            return [self.value(item_type) for _ in range(count)]
        if vtype not in _SCALAR_FORMATS:
            raise ValueError(f"GGUF: unknown metadata value type {vtype}")
        return self.scalar(_SCALAR_FORMATS[vtype])


class GGUFFile:
    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path)
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        if bytes(self._data[:4]) != GGUF_MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file (bad magic)")
        try:
            raw_infos = self._parse_header(_Cursor(memoryview(self._data)))
        except (struct.error, ValueError) as e:
            raise ValueError(f"{self.path}: corrupt or truncated GGUF header ({e})") from e
        self._tensors: dict[str, TensorInfo] = {}
        for name, dims, ggml_type, offset in raw_infos:
            n_elements = int(np.prod(dims, dtype=np.int64)) if dims else 1
            _, block_elems, block_bytes = GGML_TYPES.get(ggml_type, ("?", 1, 0))
            info = TensorInfo(name, tuple(int(d) for d in reversed(dims)), ggml_type, self._data_start + offset,
                              n_elements // block_elems * block_bytes)
            if info.offset + info.nbytes > len(self._data):
                raise ValueError(f"{self.path}: tensor {name} extends past the end of the file (truncated?)")
            self._tensors[name] = info

    def _parse_header(self, cur: _Cursor) -> list[tuple]:
        cur.pos = 4
        self.version = cur.scalar("<I")
        if self.version not in (2, 3):
            raise ValueError(f"{self.path}: unsupported GGUF version {self.version}")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        self.metadata: dict = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar("<I"))
        raw_infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = tuple(cur.scalar("<Q") for _ in range(cur.scalar("<I")))
            raw_infos.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
        self.alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        self._data_start = -(-cur.pos // self.alignment) * self.alignment
        return raw_infos

    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def tensor_info(self, name: str) -> TensorInfo:
        if name not in self._tensors:
            raise KeyError(f"{self.path.name} has no tensor {name!r}")
        return self._tensors[name]

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.tensor_info(name).shape

    def tensor_type(self, name: str) -> str:
        return self.tensor_info(name).type_name

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view into the mapped file."""
        info = self.tensor_info(name)
        return self._data[info.offset:info.offset + info.nbytes]

    def load(self, name: str) -> np.ndarray:
        """Dequantise one tensor to a fresh float32 array of shape `tensor_shape(name)`."""
        info = self.tensor_info(name)
        n = int(np.prod(info.shape, dtype=np.int64))
        return dequantize(np.asarray(self.raw(name)), info.ggml_type, n).reshape(info.shape)


# ---- dequantisation: each takes a (n_blocks, block_bytes) uint8 array and returns (n_blocks, block_elems) float32

def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The little-endian float16 at byte `start` of each block, as a float32 column."""
    return blocks[:, start:start + 2].view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Low nibbles first, then high nibbles, along the last axis (ggml's 4-bit order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4_0(b):
    return (_nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)) * _f16(b, 0)


def _q4_1(b):
    return _nibbles(b[:, 4:]) * _f16(b, 0) + _f16(b, 2)


def _q5(b, has_min: bool):
    off = 4 if has_min else 2
    high = np.unpackbits(b[:, off:off + 4], axis=-1, bitorder="little")  # bit j of qh -> element j
    q = _nibbles(b[:, off + 4:]) | (high << 4)
    if has_min:
        return q * _f16(b, 0) + _f16(b, 2)
    return (q.astype(np.int8) - np.int8(16)) * _f16(b, 0)


def _q8_0(b):
    return b[:, 2:].view(np.int8) * _f16(b, 0)


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12-byte field of Q4_K/Q5_K into 8 six-bit scales and 8 six-bit mins."""
    lo_sc, lo_mn, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo_sc & 63, (hi & 0x0F) | ((lo_sc >> 6) << 4)], axis=-1)
    mn = np.concatenate([lo_mn & 63, (hi >> 4) | ((lo_mn >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _qk(b, five_bit: bool):
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scales_mins(b[:, 4:16])
    qs = b[:, 48:176] if five_bit else b[:, 16:144]
    # 4 chunks of 32 bytes; each chunk's low nibbles form sub-block 2i and high nibbles sub-block 2i+1
    chunks = qs.reshape(-1, 4, 32)
    q = np.stack([chunks & 0x0F, chunks >> 4], axis=2).reshape(-1, 8, 32)
    if five_bit:  # bit i of qh[l] is the fifth bit of element l of sub-block i
        q = q | (np.unpackbits(b[:, 16:48, None], axis=-1, bitorder="little").transpose(0, 2, 1) << 4)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(-1, 256)


def _q6_k(b):
    ql, qh = b[:, 0:128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
    high = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=-1)
    q = (_nibbles(ql) | (high << 4)).astype(np.int8) - np.int8(32)
    scales = np.repeat(b[:, 192:208].view(np.int8).astype(np.float32), 16, axis=-1)
    return _f16(b, 208) * scales * q.reshape(-1, 256)


_PLAIN = {0: "<f4", 1: "<f2", 24: "i1", 25: "<i2", 26: "<i4", 27: "<i8", 28: "<f8"}
_QUANT = {2: _q4_0, 3: _q4_1, 6: lambda b: _q5(b, False), 7: lambda b: _q5(b, True), 8: _q8_0,
          12: lambda b: _qk(b, False), 13: lambda b: _qk(b, True), 14: _q6_k}


def dequantize(data: np.ndarray, ggml_type: int, n_elements: int) -> np.ndarray:
    """Raw ggml bytes -> flat float32 array of `n_elements`."""
    if ggml_type in _PLAIN:
        return data.view(_PLAIN[ggml_type])[:n_elements].astype(np.float32)
    if ggml_type == 30:  # bfloat16 is the top half of a float32
        return (data.view("<u2")[:n_elements].astype(np.uint32) << 16).view(np.float32)
    if ggml_type not in _QUANT:
        name = GGML_TYPES.get(ggml_type, (f"id {ggml_type}",))[0]
        supported = ", ".join(GGML_TYPES[t][0] for t in sorted([*_PLAIN, 30, *_QUANT]))
        raise ValueError(f"GGUF tensor type {name} is not supported (supported: {supported})")
    _, block_elems, block_bytes = GGML_TYPES[ggml_type]
    blocks = data[:n_elements // block_elems * block_bytes].reshape(-1, block_bytes)
    return _QUANT[ggml_type](blocks).astype(np.float32, copy=False).reshape(-1)
