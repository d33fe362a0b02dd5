"""PEFT LoRA adapters as files: what an adapter folder holds and whether it fits a model, read once by the frontend
(when an adapter is registered or first asked for) and by the worker that loads it (workers/lora.py)."""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np

from tinyvllm.protocol.model_config import ModelConfig

MODULES = ("q", "k", "v", "o", "gate", "up", "down")
PEFT_MODULES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
                "down_proj": "down"}


class LoRAError(ValueError):
    """An adapter that cannot be served over the model (a 400 naming the reason)."""


def module_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of every product an adapter may touch."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return {"q": (cfg.dim, q), "k": (cfg.dim, kv), "v": (cfg.dim, kv), "o": (q, cfg.dim),
            "gate": (cfg.dim, cfg.ffn_dim), "up": (cfg.dim, cfg.ffn_dim), "down": (cfg.ffn_dim, cfg.dim)}


def read_peft_adapter(path: str | pathlib.Path, cfg: ModelConfig, max_rank: int
                      ) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """{(layer, product): (A [r, in], scale x B [out, r])} of a PEFT LoRA folder, float32."""
    from safetensors.numpy import load_file
    folder = pathlib.Path(path)
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
        tensors = load_file(folder / "adapter_model.safetensors")
    except (OSError, ValueError) as e:
        raise LoRAError(f"no PEFT LoRA adapter at {path}: {e}") from None
    if config.get("use_dora") or config.get("bias", "none") != "none" or config.get("modules_to_save"):
        raise LoRAError(f"the adapter at {path} uses DoRA, biases or modules_to_save, which are not supported")
    shapes, adapter = module_shapes(cfg), {}
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        prefix = key.split(".lora_A.")[0]  # base_model.model.model.layers.{i}.self_attn.q_proj
        parts = prefix.split(".")
        if "layers" not in parts or parts[-1] not in PEFT_MODULES:
            raise LoRAError(f"the adapter at {path} adapts {prefix}, which is not a served product")
        layer, module = int(parts[parts.index("layers") + 1]), PEFT_MODULES[parts[-1]]
        b = tensors.get(key.replace(".lora_A.", ".lora_B."))
        rank = a.shape[0]
        if b is None or layer >= cfg.n_layers or a.shape[1:] != (shapes[module][0],) or \
                b.shape != (shapes[module][1], rank):
            raise LoRAError(f"the adapter at {path} does not fit this model ({prefix}: A {a.shape}, "
                            f"B {None if b is None else b.shape})")
        if rank > max_rank:
            raise LoRAError(f"the adapter at {path} has rank {rank}, more than --max-lora-rank {max_rank}")
        alpha = _pattern(config.get("alpha_pattern") or {}, prefix, config.get("lora_alpha", rank))
        scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        adapter[(layer, module)] = (a.astype(np.float32), (b.astype(np.float64) * scale).astype(np.float32))
    if not adapter:
        raise LoRAError(f"the adapter at {path} has no LoRA weights")
    return adapter


def _pattern(patterns: dict, prefix: str, default):
    """PEFT's per-module override: the value of the first pattern that names the end of the module's path."""
    return next((value for pattern, value in patterns.items() if prefix.endswith(pattern)), default)
