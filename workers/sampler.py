"""Sampling on the device: greedy, temperature, min-p, top-k, top-p and per-request seeds (vLLM's order).

Top-k and top-p thresholds are found by bisection over values (a few dozen row reductions) instead of a
sort over the vocabulary. Noise is a counter-based hash of (seed, position, token id), so a seeded
request samples the same tokens whatever batch it lands in.
"""
from tinygrad import Tensor, dtypes

from tinyvllm.protocol.sampling import GREEDY_TEMPERATURE

BISECTION_STEPS = 24


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash (xorshift-multiply finaliser)."""
    x = (x ^ (x >> 16)) * 0x7FEB352D
    x = (x ^ (x >> 15)) * 0x846CA68B
    return x ^ (x >> 16)


def uniform_noise(seeds: Tensor, positions: Tensor, vocab_size: int) -> Tensor:
    """[R] uint32 seeds, [R] positions -> [R, V] floats in (0, 1), a pure function of its inputs."""
    row = _mix32(seeds.cast(dtypes.uint32) ^ _mix32(positions.cast(dtypes.uint32) + 0x9E3779B9))
    col = Tensor.arange(vocab_size, dtype=dtypes.uint32).reshape(1, vocab_size)
    bits = _mix32(row.reshape(-1, 1) ^ (col * 0x85EBCA6B))
    return ((bits >> 8).cast(dtypes.float32) + 0.5) * (1.0 / (1 << 24))


def _top_k_floor(scaled: Tensor, top_k: Tensor) -> Tensor:
    """Per row, the largest value v such that at least k entries are >= v (-inf where k is off)."""
    hi = scaled.max(-1, keepdim=True)
    lo = (scaled == -float("inf")).where(hi, scaled).min(-1, keepdim=True)  # masked entries would pin lo at -inf
    k = top_k.reshape(-1, 1)
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) * 0.5
        enough = (scaled >= mid).sum(-1, keepdim=True) >= k
        lo, hi = enough.where(mid, lo), enough.where(hi, mid)
    off = (k <= 0) | (k >= scaled.shape[-1])
    return off.where(-float("inf"), lo)


def _top_p_floor(probs: Tensor, top_p: Tensor) -> Tensor:
    """Per row, the largest probability t such that the entries >= t hold at least p of the mass."""
    lo, hi = probs.min(-1, keepdim=True) * 0, probs.max(-1, keepdim=True)
    p = top_p.reshape(-1, 1)
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) * 0.5
        enough = (probs >= mid).where(probs, 0).sum(-1, keepdim=True) >= p
        lo, hi = enough.where(mid, lo), enough.where(hi, mid)
    return (p >= 1.0).where(0.0, lo)


def sample(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor, seeds: Tensor,
           positions: Tensor) -> Tensor:
    """logits [R, V] -> sampled token ids [R] (int32). Rows with temperature ~0 are greedy."""
    logits = logits.cast(dtypes.float32)
    greedy = logits.argmax(-1)
    t = temperature.maximum(GREEDY_TEMPERATURE).reshape(-1, 1)
    scaled = logits / t
    probs = scaled.softmax(-1)
    scaled = (probs >= probs.max(-1, keepdim=True) * min_p.reshape(-1, 1)).where(scaled, -float("inf"))
    scaled = (scaled >= _top_k_floor(scaled, top_k)).where(scaled, -float("inf"))
    probs = scaled.softmax(-1)
    scaled = (probs >= _top_p_floor(probs, top_p)).where(scaled, -float("inf"))
    gumbel = -(-uniform_noise(seeds, positions, logits.shape[-1]).log()).log()
    sampled = (scaled + gumbel).argmax(-1)
    return (temperature <= GREEDY_TEMPERATURE).where(greedy, sampled).cast(dtypes.int32)
