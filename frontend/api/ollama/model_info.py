"""What /api/tags, /api/show and /api/ps say about a model's weights: size, digest, details, model_info.

Everything is read from headers only (GGUF metadata and tensor infos, safetensors headers, config.json),
and cached per (path, size, mtime), so listing models stays cheap however large the weights are.
"""
from __future__ import annotations

import hashlib
import json
import math
import pathlib
import struct
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

from tinyvllm.protocol.gguf_file import GGUFFile
from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.protocol.model_path import is_gguf

# llama.cpp's general.file_type values (LLAMA_FTYPE_*)
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
               12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
               32: "BF16"}
_SAFETENSORS_DTYPES = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64", "I8": "I8", "U8": "U8"}


@dataclass(frozen=True)
class WeightsInfo:
    format: str  # "gguf" or "safetensors"
    config: ModelConfig
    parameter_count: int
    quantization_level: str
    model_info: dict = field(hash=False)  # GGUF-style keys; array values left out (see arrays)
    arrays: dict = field(hash=False)  # the metadata's arrays (tokenizer vocabulary, merges...), for verbose
    chat_template: str | None = None

    def details(self, parent: str = "") -> dict:
        return {"parent_model": parent, "format": self.format, "family": self.config.arch,
                "families": [self.config.arch], "parameter_size": parameter_size(self.parameter_count),
                "quantization_level": self.quantization_level}


def parameter_size(n: int) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}"
    return str(n)


def source_files(path: pathlib.Path) -> list[pathlib.Path]:
    return [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())


def source_size(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in source_files(path))


def cheap_digest(path: pathlib.Path) -> str:
    """Identifies a model's files without reading them: sha256 of each file's path, size and mtime."""
    h = hashlib.sha256()
    for f in source_files(path):
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def file_sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_weights_info(path: pathlib.Path) -> WeightsInfo:
    """ValueError/OSError when `path` is not a model this server can load."""
    path = pathlib.Path(path).resolve()
    st = max((f.stat() for f in source_files(path)), key=lambda s: s.st_mtime_ns)
    return _cached_info(str(path), source_size(path), st.st_mtime_ns)


@lru_cache(maxsize=64)
def _cached_info(path: str, size: int, mtime_ns: int) -> WeightsInfo:
    p = pathlib.Path(path)
    return _gguf_info(p) if is_gguf(p) else _hf_info(p)


def _gguf_info(path: pathlib.Path) -> WeightsInfo:
    gguf = GGUFFile(path)
    md = gguf.metadata
    config = ModelConfig.from_gguf_metadata(md, gguf.tensor_names)
    count = sum(math.prod(gguf.tensor_shape(n)) for n in gguf.tensor_names)
    level = _FILE_TYPES.get(md.get("general.file_type"))
    if level is None:  # the most common type among the weight matrices
        types = Counter(gguf.tensor_type(n) for n in gguf.tensor_names if len(gguf.tensor_shape(n)) == 2)
        level = types.most_common(1)[0][0] if types else "unknown"
    scalars = {k: v for k, v in md.items() if not isinstance(v, list)}
    arrays = {k: v for k, v in md.items() if isinstance(v, list)}
    info = {**scalars, "general.parameter_count": count, **{k: [] for k in arrays}}
    return WeightsInfo("gguf", config, count, level, info, arrays, md.get("tokenizer.chat_template"))


def _safetensors_header(path: pathlib.Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 100 << 20:
            raise ValueError(f"{path.name}: implausible safetensors header size {n}")
        return json.loads(f.read(n))


def _hf_info(folder: pathlib.Path) -> WeightsInfo:
    config = ModelConfig.from_hf_config(json.loads((folder / "config.json").read_text()))
    count, dtypes = 0, Counter()
    for f in sorted(folder.glob("*.safetensors")):
        for name, t in _safetensors_header(f).items():
            if name != "__metadata__":
                n = math.prod(t["shape"])
                count += n
                dtypes[t["dtype"]] += n
    level = _SAFETENSORS_DTYPES.get(dtypes.most_common(1)[0][0], "unknown") if dtypes else "unknown"
    a = config.arch
    info = {"general.architecture": a, "general.parameter_count": count, f"{a}.context_length": config.max_context,
            f"{a}.embedding_length": config.dim, f"{a}.block_count": config.n_layers,
            f"{a}.feed_forward_length": config.ffn_dim, f"{a}.attention.head_count": config.n_heads,
            f"{a}.attention.head_count_kv": config.n_kv_heads, f"{a}.rope.freq_base": config.rope_theta,
            f"{a}.attention.layer_norm_rms_epsilon": config.rms_eps, f"{a}.vocab_size": config.vocab_size}
    template = None
    if (tc := folder / "tokenizer_config.json").exists():
        template = json.loads(tc.read_text()).get("chat_template")
        template = template if isinstance(template, str) else None
    return WeightsInfo("safetensors", config, count, level, info, {}, template)
