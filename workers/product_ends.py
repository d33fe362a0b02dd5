"""The RMSNorm of a GPU product's input rows, applied inside the product kernel (workers/gpu_matvec.py,
workers/gpu_gemm.py) as each element is loaded, instead of a kernel of its own that writes the normalised rows: a
decode step on a GPU is launch-bound (a 1B shape ran ~27 kernels a layer), and the norm feeds every layer's q/k/v
and gate/up products.

The arithmetic is the unfused one's, in the same order: x * inv_rms[t] * weight[k] (workers/model.py's rms_norm),
its inverse root computed by tinygrad before the product (one small reduction).
"""
from __future__ import annotations

from tinygrad import Tensor
from tinygrad.uop.ops import UOp


def inv_rms(x: Tensor, eps: float) -> Tensor:
    """[T]: 1 / sqrt(mean(x^2) + eps) of each row (workers/model.py's rms_norm multiplies by it)."""
    return (x.square().mean(-1) + eps).rsqrt()


def norm_sources(norm: tuple[Tensor, Tensor] | None) -> tuple[Tensor, ...]:
    """A product kernel's inputs after the weight's parts: the norm's (inv_rms [T], weight [K]), or none."""
    return () if norm is None else (norm[0].float(), norm[1].float())


def split_sources(normed: bool, srcs: tuple[UOp, ...]) -> tuple[tuple[UOp, ...], tuple[UOp, ...]]:
    """A product kernel's inputs after h: (the weight's parts, the norm's (inv_rms, weight) or ())."""
    return (srcs[:-2], srcs[-2:]) if normed else (srcs, ())


def loaded(h: UOp, t: UOp, k: UOp, norm: tuple[UOp, ...]) -> UOp:
    """Element k of input row t, normalised where the product takes the norm."""
    x = h[t, k]
    return x if not norm else x * norm[0][t] * norm[1][k]
