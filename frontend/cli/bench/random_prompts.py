"""Random prompts of an exact token length, like vLLM's random dataset.

Random token ids (never a special token) are decoded to text; the text is encoded again, which rarely gives
back the same ids (neighbouring tokens merge, partial UTF-8 bytes become U+FFFD), so the re-encoded ids are
cut or topped up with more random ids and the round trip repeats until decode -> encode is stable at exactly
the asked length. The count is without special tokens (add_special_tokens=False), as vLLM counts it: a server
whose model adds a BOS token processes one more. The same tokenizer, seed and lengths always give the same
prompts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_ROUNDS = 32


@dataclass(frozen=True, slots=True)
class RandomPrompt:
    text: str
    token_ids: list[int]  # encode(text, add_special_tokens=False)


def allowed_token_ids(tokenizer) -> np.ndarray:
    """Every id below vocab_size except special tokens, BOS and EOS."""
    special = set(getattr(tokenizer, "special_token_ids", ()))
    special |= set(tokenizer.eos_token_ids)
    if tokenizer.bos_token_id is not None:
        special.add(tokenizer.bos_token_id)
    ids = np.arange(tokenizer.vocab_size, dtype=np.int64)
    return ids[~np.isin(ids, np.fromiter(special, dtype=np.int64, count=len(special)))]


def exact_length_prompt(tokenizer, length: int, rng: np.random.Generator, allowed: np.ndarray) -> RandomPrompt:
    """A prompt whose text encodes to exactly `length` tokens (ValueError if the round trip never settles)."""
    if length < 1:
        raise ValueError(f"a prompt needs at least one token, got {length}")
    ids = rng.choice(allowed, length).tolist()
    for _ in range(MAX_ROUNDS):
        text = tokenizer.decode(ids)
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == length:
            return RandomPrompt(text, ids)
        ids = ids[:length] if len(ids) > length else ids + rng.choice(allowed, length - len(ids)).tolist()
    raise ValueError(f"no {length}-token prompt after {MAX_ROUNDS} decode/encode rounds")


def random_prompts(tokenizer, num_prompts: int, input_len: int, seed: int | list[int] = 0) -> list[RandomPrompt]:
    """`num_prompts` prompts of exactly `input_len` tokens each, the same for the same seed."""
    rng = np.random.default_rng(seed)
    allowed = allowed_token_ids(tokenizer)
    return [exact_length_prompt(tokenizer, input_len, rng, allowed) for _ in range(num_prompts)]
