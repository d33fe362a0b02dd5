"""Logit processing before sampling, in vLLM's order: additive biases first (logit_bias, and min_tokens' mask on
EOS and stop tokens), then the repetition penalty (over prompt and output tokens), then the frequency and
presence penalties (over output tokens only). Greedy rows sample from the processed logits too.

The per-row token statistics live on the host (TokenStats, kept only for requests that use penalties) and go to
the device as dense [R, V] rows, so the jitted sampler keeps one fixed shape per batch bucket.
"""
import numpy as np
from tinygrad import Tensor

from tinyvllm.protocol.sampling import SamplingParams


def apply_logit_processing(logits: Tensor, bias: Tensor, output_counts: Tensor, seen: Tensor,
                           presence: Tensor, frequency: Tensor, repetition: Tensor) -> Tensor:
    """logits, bias, output_counts, seen (1 where the token is in the prompt or the output): [R, V] float;
    presence, frequency, repetition: [R]. Returns the processed logits."""
    logits = logits + bias
    rep = repetition.reshape(-1, 1)
    logits = (seen > 0).where((logits > 0).where(logits / rep, logits * rep), logits)
    logits = logits - frequency.reshape(-1, 1) * output_counts
    return logits - presence.reshape(-1, 1) * (output_counts > 0).where(1.0, 0.0)


class TokenStats:
    """One request's prompt-token presence and output-token counts over the vocabulary, updated as it samples."""

    def __init__(self, token_ids: list[int], num_prompt_tokens: int, vocab_size: int):
        self.vocab_size = vocab_size
        self.seen = np.zeros(vocab_size, np.float32)
        self.output_counts = np.zeros(vocab_size, np.float32)
        self.seen[self._in_vocab(token_ids)] = 1.0
        np.add.at(self.output_counts, self._in_vocab(token_ids[num_prompt_tokens:]), 1.0)

    def _in_vocab(self, ids: list[int]) -> np.ndarray:
        arr = np.asarray(ids, dtype=np.int64)
        return arr[(arr >= 0) & (arr < self.vocab_size)]

    def add(self, token_id: int) -> None:
        if 0 <= token_id < self.vocab_size:
            self.seen[token_id] = 1.0
            self.output_counts[token_id] += 1.0


def additive_bias(sampling: SamplingParams, num_output_tokens: int, eos_token_ids: list[int],
                  vocab_size: int) -> np.ndarray | None:
    """The [V] row added to a request's logits (logit_bias, min_tokens' -inf on stop tokens), or None if zero."""
    masked = []
    if num_output_tokens < sampling.min_tokens:
        masked = list(sampling.stop_token_ids) + ([] if sampling.ignore_eos else list(eos_token_ids))
    if not masked and not sampling.logit_bias_token_ids:
        return None
    row = np.zeros(vocab_size, np.float32)
    for token_id, value in zip(sampling.logit_bias_token_ids, sampling.logit_bias_values):
        if 0 <= token_id < vocab_size:
            row[token_id] += value
    for token_id in masked:
        if 0 <= token_id < vocab_size:
            row[token_id] = -np.inf
    return row
