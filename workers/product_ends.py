"""How a GPU product kernel (workers/gpu_matvec.py, workers/gpu_gemm.py) loads its input rows: as they are, through
the RMSNorm before the product, or as SwiGLU's activation of the gate|up product's rows. Either way the transform is
applied as each element is loaded, instead of a kernel of its own that writes the transformed rows: a decode step on
a GPU is launch-bound (a 1B shape ran ~27 kernels a layer), and a prompt's [T, ffn] activation is read and written
once less.

The arithmetic is the unfused one's, in the same order: x * inv_rms[t] * weight[k] (workers/model.py's rms_norm),
its inverse root computed by tinygrad before the product (one small reduction); silu(gate) * up (tinygrad's silu).
"""
from __future__ import annotations

import dataclasses

from tinygrad import Tensor
from tinygrad.uop.ops import UOp


def inv_rms(x: Tensor, eps: float) -> Tensor:
    """[T, 1]: 1 / sqrt(mean(x^2) + eps) of each row (workers/model.py's rms_norm multiplies by it; kept 2-D, as it
    was computed before the kernels took it: the same reduction, the same bits)."""
    return (x.square().mean(-1, keepdim=True) + eps).rsqrt()


@dataclasses.dataclass(frozen=True)
class RowInput:
    """norm: (inv_rms [T, 1], weight [K]) of the rows' RMSNorm; swiglu: the rows are [T, 2K], gate then up, and the
    product takes silu(gate) * up. One of the two at most."""
    norm: tuple[Tensor, Tensor] | None = None
    swiglu: bool = False

    def __post_init__(self):
        assert self.norm is None or not self.swiglu, "a product's rows are normalised or SwiGLU's, not both"

    def width(self, h: Tensor) -> int:
        """K: the width of the rows the product multiplies."""
        return h.shape[1] // 2 if self.swiglu else h.shape[1]

    def applied(self, h: Tensor) -> Tensor:
        """The transformed rows as tinygrad ops, for a product no GPU kernel takes."""
        if self.norm is not None:
            h = h * self.norm[0] * self.norm[1]
        return h[:, :self.width(h)].silu() * h[:, self.width(h):] if self.swiglu else h

    def sources(self) -> tuple[Tensor, ...]:
        """A product kernel's inputs after the weight's parts (the norm's two, or none)."""
        return () if self.norm is None else (self.norm[0].float(), self.norm[1].float())

    def flags(self) -> tuple[bool, bool]:
        """What the kernel's function needs to know statically: (normalised, swiglu)."""
        return self.norm is not None, self.swiglu


AS_THEY_ARE = RowInput()


def split_sources(flags: tuple[bool, bool], srcs: tuple[UOp, ...]) -> tuple[tuple[UOp, ...], tuple[UOp, ...]]:
    """A product kernel's inputs after h: (the weight's parts, the norm's (inv_rms, weight) or ())."""
    return (srcs[:-2], srcs[-2:]) if flags[0] else (srcs, ())


def loaded(h: UOp, t: UOp, k: UOp, width: int, flags: tuple[bool, bool], norm: tuple[UOp, ...]) -> UOp:
    """Element k (of `width`) of input row t, transformed as RowInput.flags says."""
    if flags[1]:
        return h[t, k].silu() * h[t, k + width]
    x = h[t, k]
    return x if not norm else x * norm[0][t, 0] * norm[1][k]


def row_transform_name(flags: tuple[bool, bool]) -> str:
    """A kernel name's suffix for its rows' transform: the three variants of one product are told apart in profiles."""
    return "_norm" if flags[0] else "_swiglu" if flags[1] else ""
