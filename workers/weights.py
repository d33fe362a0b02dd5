"""Loading a model's weights for the worker under one naming scheme.

Weights always come back with GGUF names (token_embd.weight, blk.{i}.attn_q.weight, ...,
output_norm.weight, and output.weight only when embeddings are not tied), as float32 arrays
in PyTorch (out_features, in_features) layout, and with q/k rows in the HF "rotate_half" (NeoX)
order: rotary pairs are (x[j], x[j + head_dim/2]) within each head. Matrices of the types the
kernels read, directly or repacked on the way to the device (quantized_weight.DEVICE_KIND: GGUF's Q2_K, Q3_K,
Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, IQ4_NL, IQ4_XS and BF16; a safetensors checkpoint's BF16 and float8 e4m3),
come back as workers.quantized_weight.QuantizedArray, the undequantised blocks, which act as float32 arrays
(np.asarray dequantises), and F16 matrices as float16 arrays (the device keeps them float16);
keep_quantized=False gives plain numpy float32 for everything.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import re

import numpy as np

from tinyvllm.protocol.gguf_file import GGML_TYPE_IDS, GGUFFile, unpermute_rope_rows
from tinyvllm.protocol.model_config import GEMMA_ARCHS, ModelConfig
from tinyvllm.protocol.model_path import is_gguf, resolve_model_path
from tinyvllm.workers.gguf_dequantize import SUPPORTED, dequantize_tensor
from tinyvllm.workers.quantized_weight import DEVICE_KIND, QuantizedArray

log = logging.getLogger(__name__)

_HF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_gate_up.weight",  # Phi-3
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",  # MoE routers
    # transformers v5's fused experts: [n_experts, 2 x width (gate, then up), dim] and [n_experts, dim, width]
    "mlp.experts.gate_up_proj": "ffn_gate_up_exps.weight", "mlp.experts.down_proj": "ffn_down_exps.weight",
    # gpt-oss: attention sinks, biases, a router of its own name, experts [n, dim, 2 x width] with gate and up
    # interleaved (the names here until gpt_oss_experts reorders them)
    "self_attn.sinks": "attn_sinks.weight", "self_attn.o_proj.bias": "attn_output.bias",
    "mlp.router.weight": "ffn_gate_inp.weight", "mlp.router.bias": "ffn_gate_inp.bias",
    "mlp.experts.gate_up_proj_bias": "ffn_gate_up_exps.bias", "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
}
# Gemma 2/3 norm the attention and MLP outputs too: its post_attention_layernorm is one of those, not the MLP's input's
_GEMMA_LAYER_NAMES = {**_HF_LAYER_NAMES, "post_attention_layernorm.weight": "post_attention_norm.weight",
                      "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                      "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
_HF_TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}
_HF_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
# one expert's FFN matrix (Qwen3-MoE's names, Mixtral's w1/w3/w2), named here blk.{i}.ffn_{kind}_exps.{e}.weight until
# stack_experts joins a layer's experts into one matrix
_HF_EXPERT_RE = re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight")
_EXPERT_KINDS = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}
EXPERT_MATRICES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_GGUF_EXPERT_RE = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight")


def hf_to_gguf_name(name: str, arch: str = "llama") -> str | None:
    """Canonical name for a HF tensor name; None for tensors we do not use (rotary caches)."""
    layer_names = _GEMMA_LAYER_NAMES if arch in GEMMA_ARCHS else _HF_LAYER_NAMES
    if name in _HF_TOP_NAMES:
        return _HF_TOP_NAMES[name]
    if (m := _HF_LAYER_RE.fullmatch(name)) and m.group(2) in layer_names:
        return f"blk.{m.group(1)}.{layer_names[m.group(2)]}"
    if (m := _HF_EXPERT_RE.fullmatch(name)) and m.group(3) in _EXPERT_KINDS:
        return f"blk.{m.group(1)}.ffn_{_EXPERT_KINDS[m.group(3)]}_exps.{m.group(2)}.weight"
    if name.endswith("rotary_emb.inv_freq"):
        return None
    raise ValueError(f"unexpected tensor {name!r} in checkpoint")


def stack_experts(weights: dict, config: ModelConfig) -> dict:
    """Each layer's per-expert matrices (hf_to_gguf_name's blk.{i}.ffn_{kind}_exps.{e}.weight), or 3-d ones of all
    experts (transformers v5's fused gate_up split in two), as one matrix of the experts' rows one after another,
    blk.{i}.ffn_{kind}_exps.weight [n_experts * rows, columns]: as the device holds a GGUF's 3-d expert tensor."""
    for i in range(config.n_layers):
        if (gate_up := weights.pop(f"blk.{i}.ffn_gate_up_exps.weight", None)) is not None:
            width = gate_up.shape[1] // 2
            weights[f"blk.{i}.ffn_gate_exps.weight"], weights[f"blk.{i}.ffn_up_exps.weight"] = \
                gate_up[:, :width], gate_up[:, width:]
        for kind in EXPERT_MATRICES:
            if (w := weights.get(f"blk.{i}.{kind}.weight")) is not None and w.ndim == 3:
                weights[f"blk.{i}.{kind}.weight"] = np.ascontiguousarray(w).reshape(-1, w.shape[2])
            parts = [weights.pop(f"blk.{i}.{kind}.{e}.weight", None) for e in range(config.n_experts)]
            if any(part is not None for part in parts):
                if any(part is None for part in parts):
                    raise ValueError(f"layer {i} lacks some of its {config.n_experts} experts' {kind} matrices")
                weights[f"blk.{i}.{kind}.weight"] = _concatenated_rows(parts)
    return weights


def gpt_oss_experts(weights: dict, config: ModelConfig) -> dict:
    """gpt-oss's experts as every other model's: its fused gate_up [n, dim, 2 x width] (input-major, gate and up
    interleaved) and down [n, width, dim] as output-major matrices of each expert's rows one after another, and their
    biases [n, width] / [n, dim] split likewise."""
    for i in range(config.n_layers):
        p = f"blk.{i}."
        gate_up, bias = np.asarray(weights.pop(p + "ffn_gate_up_exps.weight"), np.float32), \
            weights.pop(p + "ffn_gate_up_exps.bias")
        for kind, start in (("gate", 0), ("up", 1)):
            weights[p + f"ffn_{kind}_exps.weight"] = np.ascontiguousarray(
                gate_up[:, :, start::2].transpose(0, 2, 1)).reshape(-1, gate_up.shape[1])
            weights[p + f"ffn_{kind}_exps.bias"] = np.ascontiguousarray(bias[:, start::2])
        down = np.asarray(weights[p + "ffn_down_exps.weight"], np.float32)
        weights[p + "ffn_down_exps.weight"] = np.ascontiguousarray(down.transpose(0, 2, 1)).reshape(-1, down.shape[1])
    return weights


def _concatenated_rows(parts: list) -> np.ndarray | QuantizedArray:
    """Matrices of one width one after another, in their stored type where all share it (BF16 as QuantizedArray
    blocks, F16); float32 otherwise (a float8 checkpoint's experts, for now)."""
    if all(isinstance(p, QuantizedArray) for p in parts) and len({p.type_name for p in parts}) == 1:
        return QuantizedArray(parts[0].type_name, np.concatenate([p.blocks for p in parts]))
    if all(isinstance(p, np.ndarray) and p.dtype == np.float16 for p in parts):
        return np.concatenate(parts)
    return np.concatenate([np.asarray(part, np.float32) for part in parts])


def _load_gguf(path: pathlib.Path, keep_quantized: bool) -> tuple[ModelConfig, dict]:
    gguf = GGUFFile(path)
    config = ModelConfig.from_gguf_metadata(gguf.metadata, gguf.tensor_names)

    def load(name: str):
        kind, shape = gguf.tensor_type(name), matrix_shape(gguf.tensor_shape(name))
        if keep_quantized and QuantizedArray.keeps(kind, shape):
            return QuantizedArray.from_raw(kind, gguf.raw(name), shape)
        if keep_quantized and kind == "F16" and len(shape) == 2:
            return gguf.raw(name).view("<f2").reshape(shape)
        return dequantize_tensor(gguf, name).reshape(shape)

    if keep_quantized:
        check_widened_types(gguf)  # before the float32 copies exist
    weights = {name: load(name) for name in gguf.tensor_names}
    if config.arch == "llama":
        for i in range(config.n_layers):
            for kind, heads in (("attn_q", config.n_heads), ("attn_k", config.n_kv_heads)):
                for suffix in ("weight", "bias"):
                    if isinstance(w := weights.get(name := f"blk.{i}.{kind}.{suffix}"), QuantizedArray):
                        weights[name] = w.with_rows(lambda blocks, h=heads: unpermute_rope_rows(blocks, h))
                    elif w is not None:
                        weights[name] = unpermute_rope_rows(w, heads)
    if config.n_experts:  # GGUFs from before 3-d expert tensors (Mixtral's of 2023): blk.{i}.ffn_{kind}.{e}.weight
        for name in [n for n in weights if _GGUF_EXPERT_RE.fullmatch(n)]:
            i, kind, e = _GGUF_EXPERT_RE.fullmatch(name).groups()
            weights[f"blk.{i}.ffn_{kind}_exps.{e}.weight"] = weights.pop(name)
        weights = stack_experts(weights, config)
    if "rope_freqs.weight" in weights and config.rope_scaling is None:
        config = dataclasses.replace(config, rope_scaling={"rope_type": "rope_freqs"})
    return config, weights


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A tensor's shape as the device holds it: experts [n_experts, rows, columns] as their rows one after another."""
    return (shape[0] * shape[1], shape[2]) if len(shape) == 3 else tuple(shape)


def check_widened_types(gguf: GGUFFile) -> None:
    """The types a file has that the device holds as float32 though the file does not (a quantised tensor that is
    not a matrix of whole blocks): named in a warning, and refused (naming them) when their float32 copy would not fit
    in the memory this machine has available. (A type not read at all is refused as it is loaded, naming it.)"""
    widened: dict[str, int] = {}
    for name in gguf.tensor_names:
        kind, shape = gguf.tensor_type(name), matrix_shape(gguf.tensor_shape(name))
        if kind not in ("F32", "F16") and not QuantizedArray.keeps(kind, shape) and GGML_TYPE_IDS[kind] in SUPPORTED:
            widened[kind] = widened.get(kind, 0) + 4 * int(np.prod(shape))
    if not widened:
        return
    types, total = ", ".join(sorted(widened)), sum(widened.values())
    compact = ", ".join(t for t in DEVICE_KIND if t in GGML_TYPE_IDS)  # the GGUF types among them
    if total > (available := available_memory_bytes()):
        raise ValueError(f"{gguf.path.name}: its {types} tensors are not kept compact and would take {total / 1e9:.1f} GB "
                         f"as float32, more than the {available / 1e9:.1f} GB available (kept compact: {compact})")
    log.warning("%s: tensors of type %s are widened to float32 at load (%.2f GB); kept compact: %s",
                gguf.path.name, types, total / 1e9, compact)


def available_memory_bytes() -> float:
    """MemAvailable from /proc/meminfo (infinite where there is none to read)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return float("inf")


def _load_hf(folder: pathlib.Path) -> tuple[ModelConfig, dict]:
    """Matrices stay as stored: F16 as float16, BF16 and float8 (with their scales) as QuantizedArrays
    (workers/fp8_checkpoint.py); everything else (norms, biases, float32 matrices) float32."""
    from tinyvllm.workers.fp8_checkpoint import (DROPPED_SUFFIXES, check_quantization, fp8_matrix, scale_block,
                                                 scale_of)
    from tinyvllm.workers.safetensors_file import read_safetensors_folder

    hf_config = json.loads((folder / "config.json").read_text())
    check_quantization(hf_config)
    config = ModelConfig.from_hf_config(hf_config)
    stored = read_safetensors_folder(folder)
    scale_names = {name: scale for name in stored if (scale := scale_of(name, stored)) is not None}
    scales = set(scale_names.values())
    weights = {}
    for name, tensor in stored.items():
        if name in scales or name.endswith(DROPPED_SUFFIXES) \
                or (canonical := hf_to_gguf_name(name, config.arch)) is None:
            continue
        scale = scale_names.get(name)
        if tensor.dtype == "F8_E4M3":
            if scale is None:
                raise ValueError(f"{folder}: float8 tensor {name} has no scale ({name}_scale_inv or {name}_scale)")
            weights[canonical] = fp8_matrix(tensor.values, stored[scale].float32(), name, scale_block(hf_config))
        elif scale is not None:  # e.g. int8 codes (compressed-tensors W8A8): read without it, they would be garbage
            raise ValueError(f"{folder}: {name} is {tensor.dtype} with a scale ({scale}): only float8 e4m3 "
                             "weights with scales are supported")
        elif tensor.dtype == "BF16" and tensor.values.ndim == 2:
            weights[canonical] = QuantizedArray("BF16", tensor.values.view(np.uint8).reshape(*tensor.values.shape, 2))
        elif tensor.dtype == "F16" and tensor.values.ndim == 2:
            weights[canonical] = tensor.values
        else:
            array = tensor.float32()
            # Gemma's RMSNorm multiplies by 1 + weight; GGUF files (llama.cpp's conversion) store the sum, as here
            shift = config.arch in GEMMA_ARCHS and canonical.endswith("norm.weight")
            weights[canonical] = array + np.float32(1.0) if shift else array
    if config.arch == "gpt-oss":
        weights = gpt_oss_experts(weights, config)
    weights = stack_experts(weights, config)
    if config.tie_embeddings:
        weights.pop("output.weight", None)
    elif "output.weight" not in weights:
        raise ValueError(f"{folder}: config says embeddings are not tied but there is no lm_head.weight")
    return config, weights


def split_fused(config: ModelConfig, weights: dict) -> dict:
    """Phi-3's fused projections as the separate ones every other model has: attn_qkv into q, k and v (rows in that
    order), and gate_up (HF) or a GGUF's ffn_up of twice the MLP width into gate and up (gate first)."""
    from tinyvllm.workers.tensor_parallel import take_rows
    q_rows, kv_rows, ffn = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim, config.ffn_dim
    for i in range(config.n_layers):
        p = f"blk.{i}."
        if (qkv := weights.pop(p + "attn_qkv.weight", None)) is not None:
            for name, start, stop in (("q", 0, q_rows), ("k", q_rows, q_rows + kv_rows),
                                      ("v", q_rows + kv_rows, q_rows + 2 * kv_rows)):
                weights[p + f"attn_{name}.weight"] = take_rows(qkv, start, stop)
        gate_up = weights.pop(p + "ffn_gate_up.weight", None)
        up = weights.get(p + "ffn_up.weight")
        if gate_up is None and p + "ffn_gate.weight" not in weights and up is not None and up.shape[0] == 2 * ffn:
            gate_up = weights.pop(p + "ffn_up.weight")
        if gate_up is not None:
            weights[p + "ffn_gate.weight"], weights[p + "ffn_up.weight"] = take_rows(gate_up, 0, ffn), \
                take_rows(gate_up, ffn, 2 * ffn)
    return weights


def load_weights(path: str | pathlib.Path | None, keep_quantized: bool = True) -> tuple[ModelConfig, dict]:
    """(config, {GGUF name: float32 array or QuantizedArray}); see the module docstring."""
    path = resolve_model_path(None if path is None else str(path))
    config, weights = _load_gguf(path, keep_quantized) if is_gguf(path) else _load_hf(path)
    if not keep_quantized:
        weights = {name: np.asarray(w, np.float32) for name, w in weights.items()}
    weights = split_fused(config, weights)
    vocab = weights["token_embd.weight"].shape[0]  # the embedding is the truth (configs may pad or not)
    if vocab != config.vocab_size:
        config = dataclasses.replace(config, vocab_size=vocab)
    if "blk.0.attn_output.bias" in weights:  # gpt-oss's; Llama's with attention_bias (HF names it for o_proj too)
        config = dataclasses.replace(config, output_bias=True)
    return config, weights
