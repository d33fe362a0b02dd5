"""Hugging Face checkpoints whose matrices are float8 e4m3 codes with scales, kept as stored: each matrix becomes
an Fp8Matrix (workers/quantized_weight.py: its codes as the file has them and one float32 scale per 32 values, the
F8_E4M3 kind on the device, 9 bits a value).

The formats (`quantization_config` in config.json):
- "fp8" (transformers' FineGrainedFP8, DeepSeek-V3 and Qwen3-FP8 checkpoints): `<name>.weight_scale_inv`, one
  float32 per `weight_block_size` block (128 x 128); the value is code x scale, despite the name.
- "compressed-tensors" with float 8-bit weights (llm-compressor's FP8 and FP8-dynamic) and "fbgemm_fp8":
  `<name>.weight_scale`, per tensor ([] or [1]), per channel ([N, 1]) or per block ([N / rows, K / cols]).
Activation scales (`input_scale`, for engines that multiply in float8) are dropped: activations stay float32 here,
so a statically quantised checkpoint's logits come out slightly closer to its unquantised model than vLLM's
float8 products make them. A block of columns that is not a multiple of 32 is refused, naming it.
"""
from __future__ import annotations

import numpy as np

from tinyvllm.workers.quantized_weight import Fp8Matrix

FP8_METHODS = ("fp8", "compressed-tensors", "fbgemm_fp8")
SCALE_SUFFIXES = ("_scale_inv", "_scale")  # after the weight's own name: its scales
DROPPED_SUFFIXES = (".input_scale", ".k_scale", ".v_scale")  # activation and KV scales for float8 arithmetic


def check_quantization(hf_config: dict) -> None:
    """Refuses a quantisation method this loader cannot read, naming it (before any tensor is read); a tensor
    with a scale that is not float8 is refused as it is read (workers/weights.py)."""
    quantization = hf_config.get("quantization_config") or {}
    method = quantization.get("quant_method")
    supported = f"supported: {', '.join(FP8_METHODS)} with float8 e4m3 weights; or a GGUF file of the model"
    if method is not None and method not in FP8_METHODS:
        raise ValueError(f"quantization_config quant_method {method!r} is not supported ({supported})")
    for name, group in (quantization.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        if weights and (weights.get("type") != "float" or weights.get("num_bits") != 8):
            raise ValueError(f"quantization_config group {name!r} has {weights.get('num_bits')}-bit "
                             f"{weights.get('type')} weights, which are not supported ({supported})")


def scale_of(name: str, names) -> str | None:
    """The scale tensor's name for float8 matrix `name`, if the checkpoint has one."""
    return next((name + s for s in SCALE_SUFFIXES if name + s in names), None)


def scale_block(hf_config: dict) -> tuple[int, int] | None:
    """The rows and columns one scale covers where the format says (block scales), else None (the scales' shape
    tells: per tensor, per channel, or blocks that divide the matrix exactly)."""
    quantization = hf_config.get("quantization_config") or {}
    if quantization.get("weight_block_size"):
        return tuple(quantization["weight_block_size"])
    for group in (quantization.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        if weights.get("strategy") == "block" and weights.get("block_structure"):
            return tuple(weights["block_structure"])
        if weights.get("strategy") == "group" and weights.get("group_size"):
            return 1, weights["group_size"]
    return None


def per_block_scales(scale: np.ndarray, rows: int, cols: int, name: str,
                     block: tuple[int, int] | None = None) -> np.ndarray:
    """Any of the formats' scales as one float32 scale per row and 32-column block: [rows, cols / 32]. block: the
    rows and columns one scale covers (scale_block), where the scales' shape alone does not tell."""
    s = np.asarray(scale, np.float32)
    s = s.reshape(1, 1) if s.size == 1 else s.reshape(-1, 1) if s.ndim == 1 else s
    if block is None:
        block = (rows // s.shape[0] if s.ndim == 2 and rows % s.shape[0] == 0 else 0,
                 cols // s.shape[1] if s.ndim == 2 and cols % s.shape[1] == 0 else 0)
    row_block, col_block = block
    if s.ndim != 2 or not row_block or not col_block or s.shape != (-(-rows // row_block), -(-cols // col_block)):
        raise ValueError(f"{name}: scales of shape {tuple(np.shape(scale))} do not tile a [{rows}, {cols}] matrix"
                         + ("" if block[0] and block[1] else " (and the config gives no weight_block_size)"))
    if s.shape[1] > 1 and col_block % 32:
        raise ValueError(f"{name}: scale blocks of {col_block} columns do not hold whole 32-element blocks")
    return s[np.arange(rows) // row_block][:, np.arange(0, cols, 32) // col_block]


def fp8_matrix(codes: np.ndarray, scale: np.ndarray, name: str,
               block: tuple[int, int] | None = None) -> Fp8Matrix | np.ndarray:
    """A float8 e4m3 matrix [N, K] (uint8 codes) and its scales (see per_block_scales): an Fp8Matrix, or float32
    where K is not whole 32-element blocks."""
    rows, cols = codes.shape
    if cols % 32:
        from tinyvllm.workers.quantized_weight import E4M3_VALUES
        wide = np.repeat(per_block_scales(scale, rows, -(-cols // 32) * 32, name, block), 32, axis=1)
        return E4M3_VALUES[codes] * wide[:, :cols]
    return Fp8Matrix(codes, per_block_scales(scale, rows, cols, name, block))
