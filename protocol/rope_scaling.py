"""RoPE scaling: the inverse frequencies (and the cos/sin factor) a model was trained with past its original context,
as transformers' modeling_rope_utils computes them: `linear`, `llama3`, `yarn`, and llama.cpp's per-dimension
`rope_freqs.weight` (its form of llama3). Any other type is refused at load, never run with plain RoPE."""
import math

import numpy as np

SUPPORTED_ROPE_SCALING = ("linear", "llama3", "yarn", "rope_freqs")


def scaling_type(rope_scaling: dict | None) -> str:
    if not rope_scaling:
        return "default"
    return str(rope_scaling.get("rope_type") or rope_scaling.get("type") or "default")


def check_rope_scaling(rope_scaling: dict | None) -> None:
    """ValueError naming what is supported, for a type this module does not compute (or one missing its factor)."""
    kind = scaling_type(rope_scaling)
    if kind == "default":
        return
    if kind not in SUPPORTED_ROPE_SCALING:
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: {', '.join(SUPPORTED_ROPE_SCALING)})")
    if kind in ("linear", "llama3") and not rope_scaling.get("factor"):
        raise ValueError(f"rope_scaling {kind!r} needs a factor")


def rope_frequencies(head_dim: int, theta: float, rope_scaling: dict | None, max_context: int,
                     freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """(inverse frequencies [head_dim / 2] float64, the factor cos and sin are multiplied by)."""
    check_rope_scaling(rope_scaling)
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    kind, s = scaling_type(rope_scaling), rope_scaling or {}
    if kind == "linear":
        return inv_freq / float(s["factor"]), 1.0
    if kind == "rope_freqs":
        if freq_factors is None:
            raise ValueError("rope_scaling 'rope_freqs' needs the model's rope_freqs.weight")
        return inv_freq / np.asarray(freq_factors, np.float64).reshape(-1), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, s), 1.0
    if kind == "yarn":
        return _yarn(head_dim, theta, s, max_context)
    return inv_freq, 1.0


def _llama3(inv_freq: np.ndarray, s: dict) -> np.ndarray:
    factor, low, high = float(s["factor"]), float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_context = float(s.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return np.where(medium, smoothed, scaled)


def _yarn(head_dim: int, theta: float, s: dict, max_context: int) -> tuple[np.ndarray, float]:
    original = float(s.get("original_max_position_embeddings") or max_context)  # as transformers before v5
    factor = float(s.get("factor") or max_context / original)
    mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        attention_factor = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
                            if mscale and mscale_all_dim else get_mscale(factor))

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    low, high = correction_dim(float(s.get("beta_fast") or 32)), correction_dim(float(s.get("beta_slow") or 1))
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    extrapolation = 1 - ramp
    inv_freq = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)
