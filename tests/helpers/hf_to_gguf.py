"""A transformers model as the GGUF file llama.cpp's convert_hf_to_gguf.py would make of it, for tests.

    write_model_gguf(model, "gemma2", tmp_path / "m.gguf")

Only what the test models use: float32 tensors under llama.cpp's names, the metadata keys llama.cpp writes for
the architecture, and its conversions: Llama's q/k rows permuted to interleaved RoPE pairs, Gemma's norm weights
stored as 1 + weight, Phi-3's fused gate_up kept as one ffn_up of twice the MLP width, a layer's experts' matrices
(Qwen3-MoE, Mixtral) stacked into one 3-d tensor [experts, rows, columns]. `extra` adds metadata (the
tokenizer's, for a model a server can serve).
"""
from __future__ import annotations

import pathlib

import numpy as np

from tests.helpers.gguf_writer import write_gguf


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate_half rows -> interleaved pairs."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_metadata(config, arch: str) -> dict:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    md = {"general.architecture": arch, f"{arch}.vocab_size": config.vocab_size,
          f"{arch}.context_length": config.max_position_embeddings, f"{arch}.embedding_length": config.hidden_size,
          f"{arch}.block_count": config.num_hidden_layers, f"{arch}.feed_forward_length": config.intermediate_size,
          f"{arch}.attention.head_count": config.num_attention_heads,
          f"{arch}.attention.head_count_kv": config.num_key_value_heads,
          f"{arch}.attention.key_length": head_dim, f"{arch}.attention.value_length": head_dim,
          f"{arch}.rope.dimension_count": head_dim, f"{arch}.attention.layer_norm_rms_epsilon": config.rms_norm_eps}
    rope = getattr(config, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope)
    md[f"{arch}.rope.freq_base"] = float(rope.get("rope_theta") or getattr(config, "rope_theta", 10000.0))
    if rope.get("rope_type") == "linear":
        md[f"{arch}.rope.scaling.type"], md[f"{arch}.rope.scaling.factor"] = "linear", float(rope["factor"])
    if n_experts := getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None):
        md[f"{arch}.expert_count"], md[f"{arch}.expert_used_count"] = n_experts, config.num_experts_per_tok
        md[f"{arch}.expert_feed_forward_length"] = getattr(config, "moe_intermediate_size", config.intermediate_size)
        md[f"{arch}.expert_weights_norm"] = bool(getattr(config, "norm_topk_prob", True))
    if arch.startswith("gemma"):
        md[f"{arch}.attention.sliding_window"] = config.sliding_window
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if getattr(config, key, None):
                md[f"{arch}.{key}"] = float(getattr(config, key))
    return md


def write_model_gguf(model, arch: str, path: str | pathlib.Path, extra: dict | None = None,
                     expert_type: str = "F32", per_expert: bool = False) -> pathlib.Path:
    """expert_type: the GGUF type of the experts' matrices (the rest is F32); per_expert: each expert's matrices as
    tensors of their own, blk.{i}.ffn_{kind}.{e}.weight, as llama.cpp's converter wrote Mixtral in 2023."""
    from tinyvllm.workers.weights import hf_to_gguf_name
    config = model.config
    tensors = {}
    for name, tensor in model.state_dict().items():
        if (canonical := hf_to_gguf_name(name, arch)) is None or (canonical == "output.weight" and
                                                                   config.tie_word_embeddings):
            continue
        w = tensor.detach().float().numpy()
        if arch.startswith("gemma") and canonical.endswith("norm.weight"):
            w = w + np.float32(1.0)
        if arch == "llama" and canonical.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if "attn_q" in canonical else config.num_key_value_heads
            w = llama_cpp_permute(w, heads)
        tensors[canonical.replace("ffn_gate_up", "ffn_up")] = (np.ascontiguousarray(w, np.float32), "F32")
    for name in [name for name in tensors if name.endswith("ffn_up_exps.weight") and tensors[name][0].ndim == 3]:
        # transformers v5's fused experts (gate rows first), as llama.cpp splits them
        gate_up, width = tensors.pop(name)[0], getattr(config, "moe_intermediate_size", config.intermediate_size)
        tensors[name.replace("up_exps", "gate_exps")] = (np.ascontiguousarray(gate_up[:, :width]), "F32")
        tensors[name] = (np.ascontiguousarray(gate_up[:, width:]), "F32")
    tensors = {name: (w, expert_type if "_exps." in name else kind) for name, (w, kind) in tensors.items()}
    if per_expert:
        for name in [name for name in tensors if "_exps." in name]:
            w, kind = tensors.pop(name)
            for e in range(w.shape[0]):
                tensors[name.replace("_exps.", f".{e}.")] = (np.ascontiguousarray(w[e]), kind)
    write_gguf(path, {**gguf_metadata(config, arch), **(extra or {})}, tensors)
    return pathlib.Path(path)
