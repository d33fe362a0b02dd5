"""Model hyper-parameters (ModelConfig), read from GGUF metadata or a Hugging Face config.json."""
from __future__ import annotations

import dataclasses
import json
import pathlib

from tinyvllm.protocol.gguf_file import GGUFFile
from tinyvllm.protocol.model_path import is_gguf
from tinyvllm.protocol.rope_scaling import check_rope_scaling

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "phi3")
_HF_ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
             "MistralForCausalLM": "llama", "Phi3ForCausalLM": "phi3"}  # Mistral is Llama's layers, with a sliding window we refuse (for now)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    rope_theta: float
    rms_eps: float
    max_context: int
    tie_embeddings: bool
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    rope_scaling: dict | None = None  # protocol/rope_scaling.py: what it computes, or refused here
    qk_norm: bool = False  # an RMSNorm over each head's queries and keys before RoPE (Qwen3)

    def __post_init__(self):
        if self.arch not in SUPPORTED_ARCHS:
            raise ValueError(f"unsupported model architecture {self.arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        check_rope_scaling(self.rope_scaling)

    @classmethod
    def from_gguf_metadata(cls, md: dict, tensor_names=None) -> "ModelConfig":
        """`tensor_names` decides tie_embeddings (no output.weight -> tied); without it, tied is assumed."""
        arch = md["general.architecture"]

        def get(key, default=None):
            value = md.get(f"{arch}.{key}", default)
            if value is None:
                raise ValueError(f"GGUF metadata lacks {arch}.{key}")
            return value

        dim, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
        names = set(tensor_names) if tensor_names is not None else None
        scaling_type = md.get(f"{arch}.rope.scaling.type", "none")
        rope_scaling = None
        if scaling_type != "none":
            rope_scaling = {"rope_type": scaling_type, "factor": md.get(f"{arch}.rope.scaling.factor"),
                            "original_max_position_embeddings": md.get(f"{arch}.rope.scaling.original_context_length")}
        return cls(
            arch=arch,
            vocab_size=int(md.get(f"{arch}.vocab_size") or len(md["tokenizer.ggml.tokens"])),
            dim=dim, n_layers=int(get("block_count")), n_heads=n_heads,
            n_kv_heads=int(get("attention.head_count_kv", n_heads)),
            head_dim=int(get("attention.key_length", dim // n_heads)),
            ffn_dim=int(get("feed_forward_length")),
            rope_theta=_f32_to_decimal(get("rope.freq_base", 10000.0)),
            rms_eps=_f32_to_decimal(get("attention.layer_norm_rms_epsilon", 1e-5)),
            max_context=int(get("context_length")),
            tie_embeddings=names is None or "output.weight" not in names,
            attention_bias=arch == "qwen2" or (names is not None and "blk.0.attn_q.bias" in names),
            rope_scaling=rope_scaling, qk_norm=arch == "qwen3",
        )

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "ModelConfig":
        hf_arch = (cfg.get("architectures") or [""])[0]
        arch = _HF_ARCHS.get(hf_arch) or cfg.get("model_type")
        window, context = cfg.get("sliding_window"), int(cfg.get("max_position_embeddings", 2048))
        if window is not None and cfg.get("use_sliding_window", True) and int(window) < context:
            raise ValueError(f"sliding-window attention (a window of {window} tokens in a context of {context}) is "
                             f"not supported yet: only models whose window covers the whole context")
        dim, n_heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        rope = cfg.get("rope_parameters") or {}  # transformers v5 moved rope_theta in here
        rope_scaling = cfg.get("rope_scaling") or rope
        if rope_scaling.get("rope_type", rope_scaling.get("type", "default")) == "default":
            rope_scaling = None
        return cls(
            arch=arch, vocab_size=int(cfg["vocab_size"]), dim=dim,
            n_layers=int(cfg["num_hidden_layers"]), n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or dim // n_heads),
            ffn_dim=int(cfg["intermediate_size"]),
            rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_context=int(cfg.get("max_position_embeddings", 2048)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            rope_scaling=rope_scaling, qk_norm=arch == "qwen3",
        )


def _f32_to_decimal(x: float) -> float:
    """GGUF stores floats as float32: 1e-5 reads back as 9.9999997e-06. Undo that."""
    return float(f"{float(x):.7g}")


def read_model_config(path: str | pathlib.Path) -> ModelConfig:
    """The config of a resolved model: a .gguf file's metadata, or a Hugging Face folder's config.json."""
    path = pathlib.Path(path)
    if is_gguf(path):
        gguf = GGUFFile(path)
        return ModelConfig.from_gguf_metadata(gguf.metadata, gguf.tensor_names)
    return ModelConfig.from_hf_config(json.loads((path / "config.json").read_text()))
