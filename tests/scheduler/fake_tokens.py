"""The fake worker's "model": the token a request samples at a position, a pure function of the request and the
position (TokenFn), or of the tokens so far and the sampling parameters (SampleFn), so that outputs do not depend on
batching, chunking, caching or preemption."""
import zlib
from collections.abc import Callable

from tinyvllm.protocol.sampling import SamplingParams

EOS = 2
VOCAB = 1000

TokenFn = Callable[[str, int], int]
# (req_id, position of the new token, hash of every token before it, sampling) -> token
SampleFn = Callable[[str, int, int, SamplingParams], int]


def default_token_fn(req_id: str, position: int) -> int:
    """Never EOS: tokens start at 10."""
    return 10 + zlib.crc32(f"{req_id}:{position}".encode()) % VOCAB


def eos_at(positions: dict[str, int], base: TokenFn = default_token_fn) -> TokenFn:
    """Samples EOS for req_id when the new token lands at positions[req_id]."""
    return lambda req_id, pos: EOS if positions.get(req_id) == pos else base(req_id, pos)


def content_sample_fn(req_id: str, position: int, prefix_hash: int, sampling: SamplingParams) -> int:
    """Like a model: greedy rows follow the tokens so far; seeded rows draw from (seed, position), like the real
    sampler's noise; unseeded rows from (req_id, position). Never EOS."""
    if sampling.greedy:
        key = f"greedy:{prefix_hash}"
    elif sampling.seed is not None:
        key = f"seed:{sampling.seed}:{position}"
    else:
        key = f"random:{req_id}:{position}"
    return 10 + zlib.crc32(key.encode()) % VOCAB


def with_random_eos(base: SampleFn, one_in: int) -> SampleFn:
    def sample(req_id: str, position: int, prefix_hash: int, sampling: SamplingParams) -> int:
        token = base(req_id, position, prefix_hash, sampling)
        return EOS if zlib.crc32(f"eos:{token}:{position}".encode()) % one_in == 0 else token
    return sample
