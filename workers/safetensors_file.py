"""Read HF safetensors checkpoints (single or sharded) into float32 numpy arrays.

Parsed by hand rather than with `safetensors.numpy` because numpy has no bfloat16, which is how most
HF checkpoints are stored.
"""
from __future__ import annotations

import json
import pathlib
import struct

import numpy as np

_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
           "U8": "u1", "BOOL": "?"}


def _to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if dtype not in _DTYPES:
        raise ValueError(f"safetensors dtype {dtype} is not supported")
    return raw.view(_DTYPES[dtype]).astype(np.float32)


def read_safetensors(path: str | pathlib.Path) -> dict[str, np.ndarray]:
    """All tensors of one .safetensors file as float32 arrays."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    (header_len,) = struct.unpack("<Q", bytes(data[:8]))
    header = json.loads(bytes(data[8:8 + header_len]))
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = np.asarray(data[base + start:base + end])
        out[name] = _to_float32(raw, info["dtype"]).reshape(info["shape"])
    return out


def safetensors_files(folder: str | pathlib.Path) -> list[pathlib.Path]:
    """The checkpoint files of a HF folder, following model.safetensors.index.json when present."""
    folder = pathlib.Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return files


def read_safetensors_folder(folder: str | pathlib.Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in safetensors_files(folder):
        out.update(read_safetensors(f))
    return out
