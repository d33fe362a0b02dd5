"""Sampling parameters: what the frontend asks for, what the worker samples with."""
from dataclasses import dataclass, field

MAX_N = 128  # parallel samples per request


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1  # parallel samples of one prompt; the scheduler forks children that share the prompt's KV blocks

    @property
    def greedy(self) -> bool:
        return self.temperature <= 1e-5

    def validate(self) -> None:
        """Raises ValueError with a message fit for an HTTP 400."""
        if self.temperature < 0:
            raise ValueError("temperature must be non-negative, got %s" % self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1], got %s" % self.top_p)
        if self.top_k < -1:
            raise ValueError("top_k must be -1 (disable), 0 (disable) or at least 1, got %s" % self.top_k)
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1, got %s" % self.max_tokens)
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ValueError("seed must fit in a signed 64-bit integer")
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be between 1 and {MAX_N}, got {self.n}")
