"""What differs between the attention of one layer and another's (both kernel sets read it)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionSpec:
    """How a layer attends: scores = q.k * scale, soft-capped to cap * tanh(scores / cap) when softcap (Gemma 2),
    over the last `window` positions up to the token's own (0: all of them)."""
    scale: float
    window: int = 0
    softcap: float = 0.0

    @classmethod
    def plain(cls, head_dim: int) -> "AttentionSpec":
        """Llama's: scores scaled by 1 / sqrt(head_dim), every position, no cap."""
        return cls(head_dim ** -0.5)
