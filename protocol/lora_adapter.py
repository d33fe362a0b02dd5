"""LoRA adapters as files (a PEFT folder, or llama.cpp's LoRA GGUF): what an adapter holds and whether it fits a
model, read once by the frontend (when an adapter is registered or first asked for) and by the worker that loads it
(workers/lora.py)."""
from __future__ import annotations

import json
import math
import pathlib
import re
import struct

import numpy as np

from tinyvllm.protocol.gguf_file import GGUFFile, bf16_to_float32, unpermute_rope_rows
from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.protocol.model_path import is_gguf

MODULES = ("q", "k", "v", "o", "gate", "up", "down")
GGUF_MODULES = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o", "ffn_gate": "gate", "ffn_up": "up",
                "ffn_down": "down"}
_GGUF_LORA_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight\.lora_(a|b)")
PEFT_DEFAULT_ALPHA = 8  # LoraConfig's lora_alpha
PEFT_MODULES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
                "down_proj": "down"}


class LoRAError(ValueError):
    """An adapter that cannot be served over the model (a 400 naming the reason; not_found: no adapter there)."""

    def __init__(self, message: str, not_found: bool = False):
        super().__init__(message)
        self.not_found = not_found


def module_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of every product an adapter may touch."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return {"q": (cfg.dim, q), "k": (cfg.dim, kv), "v": (cfg.dim, kv), "o": (q, cfg.dim),
            "gate": (cfg.dim, cfg.ffn_dim), "up": (cfg.dim, cfg.ffn_dim), "down": (cfg.ffn_dim, cfg.dim)}


_FLOAT_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
_UNSUPPORTED = ("use_dora", "modules_to_save", "lora_bias", "trainable_token_indices", "alora_invocation_tokens",
                "use_qalora", "target_parameters")


def read_lora_adapter(path: str | pathlib.Path, cfg: ModelConfig, max_rank: int
                      ) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """{(layer, product): (A [r, in], scale x B [out, r])} of a PEFT LoRA folder or a llama.cpp LoRA GGUF, float32,
    q and k rows in the model's (Hugging Face's) order. LoRAError (not_found: no adapter there) for anything it cannot
    serve."""
    if is_gguf(pathlib.Path(path)):
        return _read_gguf_lora(pathlib.Path(path), cfg, max_rank)
    return _read_peft_lora(pathlib.Path(path), cfg, max_rank)


def _read_peft_lora(folder: pathlib.Path, cfg: ModelConfig, max_rank: int) -> dict:
    path = folder
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
        tensors = _read_float_tensors(folder / "adapter_model.safetensors")
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise LoRAError(f"no PEFT LoRA adapter at {path}: {e}", not_found=True) from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise LoRAError(f"the adapter at {path} is no LoRA adapter (peft_type {config.get('peft_type')!r})")
    if config.get("bias", "none") != "none" or (used := [k for k in _UNSUPPORTED if config.get(k)]):
        raise LoRAError(f"the adapter at {path} uses {', '.join(used) or 'biases'}, which are not supported")
    shapes, adapter = module_shapes(cfg), {}
    for key, a in tensors.items():
        prefix, _, kind = key.rpartition(".lora_")
        parts = prefix.split(".")
        if kind not in ("A.weight", "B.weight") or "layers" not in parts or parts[-1] not in PEFT_MODULES:
            raise LoRAError(f"the adapter at {path} has {key}, which is not a served product's LoRA weight")
        if kind == "B.weight":
            continue
        layer_text = parts[parts.index("layers") + 1] if parts.index("layers") + 1 < len(parts) else ""
        if not layer_text.isdigit():
            raise LoRAError(f"the adapter at {path} has {key}, which names no layer")
        layer, module = int(layer_text), PEFT_MODULES[parts[-1]]
        b = tensors.get(f"{prefix}.lora_B.weight")
        _check_fits(path, prefix, a, b, shapes[module], layer, cfg, max_rank)
        rank = a.shape[0]
        alpha = _pattern(config.get("alpha_pattern") or {}, prefix, config.get("lora_alpha", PEFT_DEFAULT_ALPHA))
        scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        adapter[(layer, module)] = (a, (b.astype(np.float64) * scale).astype(np.float32))
    if not adapter:
        raise LoRAError(f"the adapter at {path} has no LoRA weights")
    return adapter


def _check_fits(path, prefix: str, a: np.ndarray, b: np.ndarray | None, shape: tuple[int, int], layer: int,
                cfg: ModelConfig, max_rank: int) -> None:
    rank = a.shape[0]
    if b is None or layer >= cfg.n_layers or a.shape[1:] != (shape[0],) or b.shape != (shape[1], rank):
        raise LoRAError(f"the adapter at {path} does not fit this model ({prefix}: A {a.shape}, "
                        f"B {None if b is None else b.shape})")
    if rank > max_rank:
        raise LoRAError(f"the adapter at {path} has rank {rank}, more than --max-lora-rank {max_rank}")


def _read_gguf_lora(path: pathlib.Path, cfg: ModelConfig, max_rank: int) -> dict:
    """llama.cpp's LoRA GGUF (convert_lora_to_gguf.py): blk.{i}.{tensor}.weight.lora_a [r, in] and .lora_b [out, r],
    scaled by adapter.lora.alpha / r (alpha 0: by 1, as llama.cpp), q and k rows of llama in llama.cpp's order."""
    try:
        gguf = GGUFFile(path)
        md = gguf.metadata
    except (OSError, ValueError, KeyError, struct.error) as e:
        raise LoRAError(f"no LoRA GGUF at {path}: {e}", not_found=True) from None
    if md.get("general.type") != "adapter" or md.get("adapter.type") != "lora":
        raise LoRAError(f"{path} is no LoRA adapter (general.type {md.get('general.type')!r})")
    if "adapter.alora.invocation_tokens" in md:  # activated LoRA: applies only after its tokens, not served
        raise LoRAError(f"the adapter at {path} is an activated LoRA (aLoRA), which is not supported")
    alpha, shapes, adapter = float(md.get("adapter.lora.alpha", 0.0)), module_shapes(cfg), {}
    heads = {"q": cfg.n_heads, "k": cfg.n_kv_heads}
    for name in gguf.tensor_names:
        match = _GGUF_LORA_RE.fullmatch(name)
        if match is None or match.group(2) not in GGUF_MODULES:
            raise LoRAError(f"the adapter at {path} has {name}, which is not a served product's LoRA weight")
        if match.group(3) == "b":
            continue
        layer, module = int(match.group(1)), GGUF_MODULES[match.group(2)]
        a = _gguf_float(gguf, name, path)
        b = _gguf_float(gguf, name[:-1] + "b", path) if name[:-1] + "b" in gguf.tensor_names else None
        _check_fits(path, name, a, b, shapes[module], layer, cfg, max_rank)
        if module in heads and md.get("general.architecture") == "llama":
            b = unpermute_rope_rows(b, heads[module])
        scale = alpha / a.shape[0] if alpha else 1.0
        adapter[(layer, module)] = (a, (b.astype(np.float64) * scale).astype(np.float32))
    if not adapter:
        raise LoRAError(f"the adapter at {path} has no LoRA weights")
    return adapter


def _gguf_float(gguf: GGUFFile, name: str, path) -> np.ndarray:
    kind = gguf.tensor_type(name)
    if kind not in _FLOAT_DTYPES:
        raise LoRAError(f"the adapter at {path} stores {name} as {kind}: only F32, F16 and BF16 are read")
    return _float32(gguf.raw(name).view(_FLOAT_DTYPES[kind]).reshape(gguf.tensor_shape(name)), kind)


def _float32(values: np.ndarray, kind: str) -> np.ndarray:
    """F32, F16 or BF16 (its uint16 bits) values as float32."""
    return bf16_to_float32(values) if kind == "BF16" else values.astype(np.float32)


def _read_float_tensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of a small .safetensors file as float32 (numpy has no bfloat16: its bits are widened here)."""
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header, base, tensors = json.loads(data[8:8 + header_len]), 8 + header_len, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = np.dtype(_FLOAT_DTYPES[info["dtype"]])
        start, end = info["data_offsets"]
        count = math.prod(info["shape"])
        if end - start != count * dtype.itemsize or base + end > len(data):
            raise ValueError(f"{name}: its data does not match its shape")
        values = np.frombuffer(data, dtype, count, base + start).reshape(info["shape"])
        tensors[name] = _float32(values, info["dtype"])
    return tensors


def _pattern(patterns: dict, prefix: str, default):
    """PEFT's per-module override (its alpha_pattern): the value of the first pattern, a regular expression, that
    matches the end of the module's path at a dot."""
    return next((value for pattern, value in patterns.items() if re.match(rf"(.*\.)?({pattern})$", prefix)), default)
