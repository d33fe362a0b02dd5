"""Pure-numpy GGUF reader: header, metadata, tensor infos, and each tensor's raw bytes.

The file is memory-mapped; no tensor data is read until `raw()` is used. Both processes read headers
(the frontend for the tokenizer and model info); turning the bytes into float32 weights is the worker's
job (workers/gguf_dequantize.py).
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""
from __future__ import annotations

import hashlib
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
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}
GGML_TYPE_IDS = {name: type_id for type_id, (name, _, _) in GGML_TYPES.items()}
HEADERS_CACHED = 2  # parsed headers kept per process (a tokenizer's vocabulary and merges: ~10-30 MB each)
_HEADERS: dict[tuple, tuple] = {}


def forget_parsed_headers() -> None:
    """Frees the parsed headers a process keeps (their vocabularies: ~10-30 MB of Python strings each) once it has
    what it needs from them: a worker its model, the frontend its tokenizer. A later GGUFFile parses again."""
    _HEADERS.clear()


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


_U64 = struct.Struct("<Q")


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

    def strings(self, count: int) -> list[str]:
        """count strings in a row: a tokenizer's vocabulary and merges (~10^5 each), in one tight loop."""
        buf, pos, out, unpack = self.buf, self.pos, [], _U64.unpack_from
        for _ in range(count):
            (n,) = unpack(buf, pos)
            out.append(str(buf[pos + 8:pos + 8 + n], "utf-8", "replace"))
            pos += 8 + n
        if pos > len(buf):
            raise ValueError("a string runs past the end of the file")
        self.pos = pos
        return out

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
            if item_type == _STRING:
                return self.strings(count)
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
        if len(self._data) < 8:
            raise ValueError(f"{self.path}: truncated GGUF header")
        if (version := struct.unpack_from("<I", self._data, 4)[0]) not in (2, 3):
            raise ValueError(f"{self.path}: unsupported GGUF version {version}")
        # A process reads one file's header several times (config, fingerprint, tokenizer): parsed once, and found
        # again by the file's identity and its header's bytes (a file rewritten in place within one timestamp tick)
        stat = self.path.stat()
        key = (str(self.path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        header = _HEADERS.get(key)
        if header is None or hashlib.blake2b(self._data[:header[4]]).digest() != header[5]:
            try:
                parsed = self._parse_header(_Cursor(memoryview(self._data)))
            except (struct.error, ValueError) as e:
                raise ValueError(f"{self.path}: corrupt or truncated GGUF header ({e})") from e
            header = _HEADERS[key] = (*parsed, hashlib.blake2b(self._data[:parsed[4]]).digest())
            while len(_HEADERS) > HEADERS_CACHED:
                _HEADERS.pop(next(iter(_HEADERS)), None)
        self.version, metadata, raw_infos, self.alignment, self._data_start, _ = header
        self.metadata = {k: list(v) if isinstance(v, list) else v for k, v in metadata.items()}  # callers' own lists
        self._tensors: dict[str, TensorInfo] = {}
        for name, dims, ggml_type, offset in raw_infos:
            n_elements = int(np.prod(dims, dtype=np.int64)) if dims else 1
            _, block_elems, block_bytes = GGML_TYPES.get(ggml_type, ("?", 1, 0))
            info = TensorInfo(name, tuple(int(d) for d in reversed(dims)), ggml_type, self._data_start + offset,
                              n_elements // block_elems * block_bytes)
            if info.offset + info.nbytes > len(self._data):
                raise ValueError(f"{self.path}: tensor {name} extends past the end of the file (truncated?)")
            self._tensors[name] = info

    def _parse_header(self, cur: _Cursor) -> tuple:
        """(version, metadata, raw tensor infos, alignment, where the data starts)"""
        cur.pos = 4
        version = cur.scalar("<I")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        metadata: dict = {}
        for _ in range(n_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.scalar("<I"))
        raw_infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = tuple(cur.scalar("<Q") for _ in range(cur.scalar("<I")))
            raw_infos.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
        alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        return version, metadata, raw_infos, alignment, -(-cur.pos // alignment) * alignment

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


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp stores llama q/k rows interleaved per head (pairs x[2j], x[2j+1]); return rotate_half order."""
    head_dim = w.shape[0] // n_heads
    rest = w.shape[1:]
    return np.ascontiguousarray(w.reshape(n_heads, head_dim // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape))


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values (their uint16 bits) as float32: a bfloat16 is the top half of a float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)
