"""Read HF safetensors checkpoints (single or sharded) as stored: each tensor a view of the mapped file in its own
width (bfloat16 as its uint16 bits, float8 as its uint8 codes), widened only where the loader asks
(workers/weights.py keeps 16-bit and float8 matrices as they are).

Parsed by hand rather than with `safetensors.numpy` because numpy has no bfloat16 or float8, which is how most
HF checkpoints are stored.
"""
from __future__ import annotations

import json
import pathlib
import struct
from typing import NamedTuple

import numpy as np

_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "F8_E4M3": "u1", "I64": "<i8",
           "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


class StoredTensor(NamedTuple):
    dtype: str  # the safetensors dtype name: "BF16", "F8_E4M3", "F32", ...
    values: np.ndarray  # the stored values in their shape: BF16 as uint16 bits, F8_E4M3 as uint8 codes

    def float32(self) -> np.ndarray:
        if self.dtype == "BF16":
            from tinyvllm.protocol.gguf_file import bf16_to_float32
            return bf16_to_float32(self.values)
        if self.dtype == "F8_E4M3":
            from tinyvllm.workers.quantized_weight import E4M3_VALUES
            return E4M3_VALUES[self.values]
        return self.values.astype(np.float32, copy=False)  # float32 stays a view of the mapped file


def read_safetensors(path: str | pathlib.Path) -> dict[str, StoredTensor]:
    """All tensors of one .safetensors file, as stored (views of the mapped file)."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    (header_len,) = struct.unpack("<Q", bytes(data[:8]))
    header = json.loads(bytes(data[8:8 + header_len]))
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{pathlib.Path(path).name}: tensor {name} has safetensors dtype {info['dtype']}, which "
                             f"is not supported (supported: {', '.join(_DTYPES)})")
        start, end = info["data_offsets"]
        values = np.asarray(data[base + start:base + end]).view(_DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = StoredTensor(info["dtype"], values)
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


def read_safetensors_folder(folder: str | pathlib.Path) -> dict[str, StoredTensor]:
    out: dict[str, StoredTensor] = {}
    for f in safetensors_files(folder):
        out.update(read_safetensors(f))
    return out
