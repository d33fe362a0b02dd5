"""Model hyper-parameters (ModelConfig), read from GGUF metadata or a Hugging Face config.json."""
from __future__ import annotations

import dataclasses
import json
import pathlib

from tinyvllm.protocol.gguf_file import GGUFFile
from tinyvllm.protocol.model_path import is_gguf
from tinyvllm.protocol.rope_scaling import check_rope_scaling

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "gpt-oss", "phi3", "gemma2", "gemma3")
_HF_ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
             "MistralForCausalLM": "llama", "Phi3ForCausalLM": "phi3",  # Mistral: Llama's layers and a sliding window
             "MixtralForCausalLM": "llama",  # llama.cpp's name too: Llama's layers with experts
             "Qwen3MoeForCausalLM": "qwen3moe", "GptOssForCausalLM": "gpt-oss", "Gemma2ForCausalLM": "gemma2",
             "Gemma3ForCausalLM": "gemma3"}
QK_NORM_ARCHS = ("qwen3", "qwen3moe", "gemma3")
GEMMA_ARCHS = ("gemma2", "gemma3")


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
    qk_norm: bool = False  # an RMSNorm over each head's queries and keys before RoPE (Qwen3, Gemma 3)
    # Per layer, the positions a token attends back to, itself included (0: the whole context); () when all are 0.
    layer_windows: tuple[int, ...] = ()
    attention_scale: float = 0.0  # scores = q.k * this (0: head_dim ** -0.5; Gemma: query_pre_attn_scalar ** -0.5)
    attn_softcap: float = 0.0  # scores = cap * tanh(scores / cap) (Gemma 2); 0: none
    final_softcap: float = 0.0  # the same on the logits
    embed_scale: float = 1.0  # embeddings are multiplied by this (Gemma: sqrt(dim))
    hidden_act: str = "silu"  # the MLP's gate activation: silu, or gelu_tanh (Gemma's GeGLU)
    rope_local_theta: float = 0.0  # the RoPE base of sliding-window layers, without scaling (Gemma 3); 0: as the rest
    # Mixture of experts (every layer's MLP): n_experts FFNs of width expert_ffn_dim, each token through the
    # n_experts_used with the highest router probabilities (softmax over all experts), weighted by them, renormalised
    # to sum to 1 if norm_topk_prob. 0 experts: a dense MLP of ffn_dim.
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn_dim: int = 0
    norm_topk_prob: bool = True
    # gpt-oss: a learned logit per query head that joins every softmax of its scores (an attention sink), a bias on
    # the attention output, the router and every expert's matrices, and its SwiGLU: gate and up clamped to
    # swiglu_limit, (up + 1) * gate * sigmoid(1.702 gate). 0: the plain SwiGLU.
    attention_sinks: bool = False
    output_bias: bool = False  # set by workers/weights.load_weights where the attention output has a bias
    expert_bias: bool = False
    swiglu_limit: float = 0.0

    def __post_init__(self):
        if self.arch not in SUPPORTED_ARCHS:
            raise ValueError(f"unsupported model architecture {self.arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        check_rope_scaling(self.rope_scaling)
        if self.layer_windows and len(self.layer_windows) != self.n_layers:
            raise ValueError(f"{len(self.layer_windows)} layer windows for {self.n_layers} layers")
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"unsupported MLP activation {self.hidden_act!r} (supported: silu, gelu_tanh)")
        if self.n_experts and not 0 < self.n_experts_used <= self.n_experts:
            raise ValueError(f"{self.n_experts_used} experts per token of {self.n_experts}")

    def window(self, layer: int) -> int:
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def sliding_window_everywhere(self) -> int:
        """The largest window, where every layer has one (Mistral): the scheduler frees the blocks behind it, which
        no layer reads. 0 otherwise."""
        return max(self.layer_windows) if self.layer_windows and all(self.layer_windows) else 0

    @property
    def scale(self) -> float:
        return self.attention_scale or self.head_dim ** -0.5

    def layers_slice(self, layers: range) -> "ModelConfig":
        """The config of a pipeline stage holding `layers` (numbered from 0 there)."""
        windows = self.layer_windows[layers.start:layers.stop] if self.layer_windows else ()
        return dataclasses.replace(self, n_layers=len(layers), layer_windows=windows)

    @classmethod
    def from_gguf_metadata(cls, md: dict, tensor_names=None) -> "ModelConfig":
        """`tensor_names` decides tie_embeddings (no output.weight -> tied); without it, tied is assumed."""
        arch = md["general.architecture"]
        if arch == "gpt-oss":
            raise ValueError("gpt-oss GGUFs (their MXFP4 experts) are not supported yet: use its Hugging Face folder")

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
            rope_scaling=rope_scaling, qk_norm=arch in QK_NORM_ARCHS,
            **_gguf_experts(md, arch),
            **(_gemma_gguf(md, arch, dim, n_heads) if arch in GEMMA_ARCHS else {}),
        )

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "ModelConfig":
        hf_arch = (cfg.get("architectures") or [""])[0]
        arch = _HF_ARCHS.get(hf_arch) or {"gemma3_text": "gemma3"}.get(cfg.get("model_type"), cfg.get("model_type"))
        dim, n_heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        rope = cfg.get("rope_parameters") or {}  # transformers v5 moved rope_theta in here
        rope = rope.get("full_attention", rope)  # Gemma 3 under v5: one set per layer type (the local: _gemma_hf)
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
            rope_scaling=rope_scaling, qk_norm=arch in QK_NORM_ARCHS,
            layer_windows=_hf_layer_windows(cfg, arch), **_hf_experts(cfg, arch),
            **(dict(attention_sinks=True, expert_bias=True,
                    swiglu_limit=float(cfg.get("swiglu_limit", 7.0))) if arch == "gpt-oss" else {}),
            **(_gemma_hf(cfg, dim) if arch in GEMMA_ARCHS else {}),
        )


def _gguf_experts(md: dict, arch: str) -> dict:
    """A GGUF's expert counts ({} for a dense model); llama.cpp writes Mixtral's expert width as feed_forward_length."""
    if not (n_experts := int(md.get(f"{arch}.expert_count") or 0)):
        return {}
    return dict(n_experts=n_experts, n_experts_used=int(md[f"{arch}.expert_used_count"]),
                expert_ffn_dim=int(md.get(f"{arch}.expert_feed_forward_length") or md[f"{arch}.feed_forward_length"]),
                norm_topk_prob=bool(md.get(f"{arch}.expert_weights_norm", True)))


def _hf_experts(cfg: dict, arch: str) -> dict:
    """Qwen3-MoE's and Mixtral's expert counts ({} for a dense model); a model with dense layers among its sparse
    ones (Qwen3-MoE's mlp_only_layers, decoder_sparse_step) is refused."""
    n_experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if not n_experts:
        return {}
    if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step") or 1) != 1:
        raise ValueError("models whose layers mix dense and expert MLPs (mlp_only_layers, decoder_sparse_step) are "
                         "not supported")
    return dict(n_experts=n_experts, n_experts_used=int(cfg["num_experts_per_tok"]),
                expert_ffn_dim=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
                # transformers' Qwen3MoeConfig defaults to False; Mixtral always renormalises
                norm_topk_prob=bool(cfg.get("norm_topk_prob", arch != "qwen3moe")))


def _windows(n_layers: int, window: int, context: int, sliding) -> tuple[int, ...]:
    """Per-layer windows, () when no layer's window is shorter than the context; sliding(i): whether layer i slides."""
    windows = tuple(window if window and window < context and sliding(i) else 0 for i in range(n_layers))
    return windows if any(windows) else ()


def _hf_layer_windows(cfg: dict, arch: str) -> tuple[int, ...]:
    n, context = int(cfg["num_hidden_layers"]), int(cfg.get("max_position_embeddings", 2048))
    window = int(cfg.get("sliding_window") or 0) if cfg.get("use_sliding_window", True) else 0
    if types := cfg.get("layer_types"):
        return _windows(n, window, context, lambda i: types[i] == "sliding_attention")
    if arch in ("qwen2", "qwen3", "qwen3moe") and window:  # without layer_types: from max_window_layers on, they slide
        return _windows(n, window, context, lambda i: i >= int(cfg.get("max_window_layers", n)))
    return _windows(n, window, context, lambda i: _gemma_sliding(arch, i, cfg.get("sliding_window_pattern", 6)))


def _gemma_sliding(arch: str, layer: int, pattern: int = 6) -> bool:
    """Gemma 2 alternates local and global layers, local first; Gemma 3 has `pattern - 1` local layers per global
    one; every layer of any other model with a window slides (Mistral)."""
    if arch == "gemma2":
        return layer % 2 == 0
    if arch == "gemma3":
        return (layer + 1) % int(pattern) != 0
    return True


def _gemma_hf(cfg: dict, dim: int) -> dict:
    local = ((cfg.get("rope_parameters") or {}).get("sliding_attention") or {}).get("rope_theta")
    return dict(attention_scale=float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5,
                attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
                final_softcap=float(cfg.get("final_logit_softcapping") or 0.0), embed_scale=dim ** 0.5,
                hidden_act=_activation(cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"),
                rope_local_theta=float(cfg.get("rope_local_base_freq") or local or 0.0))


def _gemma_gguf(md: dict, arch: str, dim: int, n_heads: int) -> dict:
    """llama.cpp's reading of a Gemma GGUF: the 27B models scale queries by hidden/heads (their
    query_pre_attn_scalar), the others by the head size; Gemma 3's local layers use RoPE base 10000."""
    n_layers, head_dim = int(md[f"{arch}.block_count"]), int(md.get(f"{arch}.attention.key_length", dim // n_heads))
    big = n_layers == (46 if arch == "gemma2" else 62)
    context, window = int(md[f"{arch}.context_length"]), int(md.get(f"{arch}.attention.sliding_window", 0))
    return dict(attention_scale=(dim / n_heads if big else head_dim) ** -0.5,
                attn_softcap=float(md.get(f"{arch}.attn_logit_softcapping", 0.0)),
                final_softcap=float(md.get(f"{arch}.final_logit_softcapping", 0.0)), embed_scale=dim ** 0.5,
                hidden_act="gelu_tanh", rope_local_theta=10000.0 if arch == "gemma3" else 0.0,
                layer_windows=_windows(n_layers, window, context, lambda i: _gemma_sliding(arch, i)))


def _activation(name: str) -> str:
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return "gelu_tanh"
    raise ValueError(f"unsupported MLP activation {name!r} (supported: silu, gelu_pytorch_tanh)")


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
