"""A minimal GGUF v3 writer: the tests' tiny models and synthetic quantised blocks, the benchmarks' shape twins.

    write_gguf(path, {"general.architecture": "llama", ...},
               {"token_embd.weight": (np.ndarray, "Q8_0"), "output_norm.weight": (np.ndarray, "F32")})

Arrays are given in numpy (row-major) order; GGUF stores the dims reversed. Quantised types need the
last dim to be a multiple of 32. Metadata types are inferred: bool -> BOOL, int -> UINT32 (INT64 if it
does not fit), float -> FLOAT32, str -> STRING, list -> ARRAY of the first element's type; numpy scalars
keep their own type.
"""
from __future__ import annotations

import pathlib
import struct

import numpy as np

ALIGNMENT = 32
GGML_TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
_NUMPY_VALUE_TYPES = {np.uint8: (0, "<B"), np.int8: (1, "<b"), np.uint16: (2, "<H"), np.int16: (3, "<h"),
                      np.uint32: (4, "<I"), np.int32: (5, "<i"), np.float32: (6, "<f"), np.bool_: (7, "<?"),
                      np.uint64: (10, "<Q"), np.int64: (11, "<q"), np.float64: (12, "<d")}


def _value_type(value) -> tuple[int, str | None]:
    if isinstance(value, np.generic):
        return _NUMPY_VALUE_TYPES[type(value)]
    if isinstance(value, bool):
        return 7, "<?"
    if isinstance(value, int):
        return (4, "<I") if 0 <= value < 2**32 else (11, "<q")
    if isinstance(value, float):
        return 6, "<f"
    if isinstance(value, str):
        return 8, None
    if isinstance(value, (list, tuple)):
        return 9, None
    raise TypeError(f"cannot store {type(value).__name__} in GGUF metadata")


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _payload(value, vtype: int, fmt: str | None) -> bytes:
    if vtype == 8:
        return _string(value)
    if vtype == 9:
        item_type, item_fmt = _value_type(value[0]) if len(value) else (5, "<i")
        if item_type in (4, 11):  # keep one integer type for the whole array
            item_type, item_fmt = (4, "<I") if all(0 <= v < 2**32 for v in value) else (11, "<q")
        body = b"".join(_payload(v, item_type, item_fmt) for v in value)
        return struct.pack("<IQ", item_type, len(value)) + body
    return struct.pack(fmt, value)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").reshape(-1, 1).view(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values in 0..15 -> (n, 16) bytes: element j in the low nibble, j+16 in the high one."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def quantize(x: np.ndarray, type_name: str) -> bytes:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if type_name == "F32":
        return x.astype("<f4").tobytes()
    if type_name == "F16":
        return x.astype("<f2").tobytes()
    if x.shape[-1] % 32:
        raise ValueError(f"{type_name} needs the last dim to be a multiple of 32, got shape {x.shape}")
    blocks = x.reshape(-1, 32)
    if type_name == "Q8_0":
        d = np.abs(blocks).max(axis=1, keepdims=True) / 127
        inv = np.divide(1, d, out=np.zeros_like(d), where=d > 0)
        q = np.clip(np.round(blocks * inv), -127, 127).astype(np.int8)
        return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1).tobytes()
    if type_name == "Q4_0":
        extreme = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)][:, None]
        d = extreme / -8
        inv = np.divide(1, d, out=np.zeros_like(d), where=d != 0)
        q = np.clip(np.floor(blocks * inv + 8.5), 0, 15)
        return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=1).tobytes()
    if type_name == "Q4_1":
        lo, hi = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
        d = (hi - lo) / 15
        inv = np.divide(1, d, out=np.zeros_like(d), where=d > 0)
        q = np.clip(np.floor((blocks - lo) * inv + 0.5), 0, 15)
        return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], axis=1).tobytes()
    raise ValueError(f"gguf_writer cannot quantise to {type_name}")


def _type_id(type_name: str) -> int:
    if type_name in GGML_TYPE_IDS:
        return GGML_TYPE_IDS[type_name]
    import gguf
    return int(gguf.GGMLQuantizationType[type_name])


def gguf_header(metadata: dict, tensors: list[tuple[str, tuple[int, ...], str, int]]) -> bytes:
    """The header of a GGUF file (magic, metadata, tensor infos, padding up to the data) for tensors given as
    (name, numpy-order shape, type name, byte size) in the order their data follows, each padded to ALIGNMENT."""
    header = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    for key, value in metadata.items():
        vtype, fmt = _value_type(value)
        header += [_string(key), struct.pack("<I", vtype), _payload(value, vtype, fmt)]
    offset = 0
    for name, shape, type_name, nbytes in tensors:
        dims = tuple(reversed(shape))
        header += [_string(name), struct.pack(f"<I{len(dims)}Q", len(dims), *dims),
                   struct.pack("<IQ", _type_id(type_name), offset)]
        offset += nbytes + (-nbytes % ALIGNMENT)
    head = b"".join(header)
    return head + b"\0" * (-len(head) % ALIGNMENT)


# where each block type keeps its float16 scales (and minimums): random bytes elsewhere are valid codes and scales
F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
              "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,), "Q2_K": (80, 82), "Q3_K": (108,)}


def random_blocks(type_name: str, shape: tuple[int, ...], rng: np.random.Generator,
                  scale_std: float = 0.02) -> np.ndarray:
    """Valid random blocks [*shape, block bytes] of a block type: random bytes (every code and sub-block scale)
    with finite float16 scales of standard deviation scale_std."""
    import gguf
    nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][1]
    blocks = rng.integers(0, 256, (*shape, nbytes), dtype=np.uint8)
    for start in F16_FIELDS[type_name]:
        scale = (rng.standard_normal(shape) * scale_std).astype("<f2")
        blocks[..., start:start + 2] = scale[..., None].view(np.uint8)
    return blocks


class Blocks:
    """A tensor given as its raw blocks [rows, blocks per row, block bytes] of `type_name` (any type, as written)."""

    def __init__(self, blocks: np.ndarray, type_name: str):
        import gguf  # llama.cpp's package: the block sizes as ggml defines them
        elems, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
        assert blocks.dtype == np.uint8 and blocks.ndim == 3 and blocks.shape[2] == nbytes, blocks.shape
        self.blocks, self.shape = blocks, (blocks.shape[0], blocks.shape[1] * elems)


class Raw:
    """A tensor given as its bytes as stored (another GGUF's, any type) and its numpy-order shape."""

    def __init__(self, data: np.ndarray | bytes, shape: tuple[int, ...]):
        self.data, self.shape = bytes(data), tuple(shape)


def write_gguf(path: str | pathlib.Path, metadata: dict,
               tensors: dict[str, tuple[np.ndarray | Blocks | Raw, str | int]]) -> pathlib.Path:
    path = pathlib.Path(path)
    id_to_name = {v: k for k, v in GGML_TYPE_IDS.items()}
    infos, data = [], []
    for name, (array, ggml_type) in tensors.items():
        type_name = id_to_name[ggml_type] if isinstance(ggml_type, int) else ggml_type
        if isinstance(array, Raw):
            raw, shape = array.data, array.shape
        elif isinstance(array, Blocks):
            raw, shape = array.blocks.tobytes(), array.shape
        else:
            array = np.asarray(array)
            raw, shape = quantize(array, type_name), array.shape
        infos.append((name, shape, type_name, len(raw)))
        data += [raw, b"\0" * (-len(raw) % ALIGNMENT)]
    path.write_bytes(gguf_header(metadata, infos) + b"".join(data))
    return path
