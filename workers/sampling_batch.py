"""One step's sampling: host-side inputs for the rows that sample, the jitted sampler variant they need, and its
outputs turned into tokens and logprobs.

Variants (each one TinyJit per batch bucket, compiled when first needed): the greedy fast path is a bare argmax;
rows with penalties, logit_bias or an active min_tokens add dense [R, V] inputs; a structured output row adds the
[R, V] mask of the tokens its grammar allows (-inf elsewhere, after the other processing); logprobs add a
log_softmax and a top-k (bucketed k) of the raw logits at the sampled tokens.
"""
from dataclasses import dataclass

import numpy as np
from tinygrad import Tensor, TinyJit, dtypes

from tinyvllm.protocol.messages import TokenLogprobs
from tinyvllm.workers.batch_state import RequestState
from tinyvllm.workers.device_input import device_tensor, host_array
from tinyvllm.workers.logprobs import logprobs_of, to_token_logprobs, top_count_bucket
from tinyvllm.workers.penalties import additive_bias, apply_logit_processing
from tinyvllm.workers.sampler import sample


@dataclass(frozen=True, slots=True)
class SamplerVariant:
    greedy: bool  # every row is greedy: argmax, no noise
    processed: bool  # some row has penalties, logit_bias or a min_tokens mask
    top_count: int | None  # logprobs wanted, with this top-k bucket; None: no logprobs
    masked: bool = False  # some row has a grammar: the last input is the [R, V] mask of allowed tokens


def sampler_body(variant: SamplerVariant):
    """The function one variant jits: (logits, *inputs) -> (tokens, *logprobs outputs), inputs as build_inputs."""
    def body(logits: Tensor, *inputs: Tensor) -> tuple[Tensor, ...]:
        raw = logits.cast(dtypes.float32)
        rest = list(inputs)
        allowed = rest.pop() if variant.masked else None
        processed = raw
        if variant.processed:
            bias, counts, seen, penalties = rest[-4:]
            processed = apply_logit_processing(raw, bias, counts, seen, penalties[0], penalties[1], penalties[2])
        if allowed is not None:
            processed = allowed.where(processed, -float("inf"))
        if variant.greedy:
            tokens = processed.argmax(-1).cast(dtypes.int32)
        else:
            params, seeds, positions = rest[:3]
            tokens = sample(processed, params[0], params[1].cast(dtypes.int32), params[2], params[3], seeds, positions)
        outs = (tokens,) if variant.top_count is None else (tokens, *logprobs_of(raw, tokens, variant.top_count))
        Tensor.realize(*outs)
        return outs
    return body


def build_inputs(states: list[RequestState], R_pad: int, vocab_size: int,
                 allowed: np.ndarray | None = None) -> tuple[SamplerVariant, list[np.ndarray]]:
    """The variant these rows need and its inputs (padding rows are greedy and unprocessed). allowed: [R, V] bool,
    the tokens each row may sample (structured output), or None when no row is constrained."""
    biases = [additive_bias(s.sampling, s.num_output_tokens, s.eos_token_ids, vocab_size) for s in states]
    processed = any(b is not None or s.sampling.uses_penalties for s, b in zip(states, biases))
    asked = [s.sampling.logprobs for s in states if s.sampling.logprobs is not None]
    variant = SamplerVariant(all(s.sampling.greedy for s in states), processed,
                             top_count_bucket(max(asked)) if asked else None, allowed is not None)
    inputs: list[np.ndarray] = []
    if not variant.greedy:
        params = np.zeros((4, R_pad), np.float32)
        seeds, positions = np.zeros(R_pad, np.uint32), np.zeros(R_pad, np.int32)
        for j, s in enumerate(states):
            sp = s.sampling
            params[:, j] = (sp.temperature, sp.top_k, sp.top_p, sp.min_p)
            seeds[j], positions[j] = s.seed, len(s.token_ids)
        inputs += [params, seeds, positions]
    if variant.processed:
        bias, counts, seen = (np.zeros((R_pad, vocab_size), np.float32) for _ in range(3))
        penalties = np.zeros((3, R_pad), np.float32)
        penalties[2] = 1.0
        for j, (s, b) in enumerate(zip(states, biases)):
            if b is not None:
                bias[j] = b
            sp = s.sampling
            if sp.uses_penalties:
                stats = s.token_stats(vocab_size)
                counts[j], seen[j] = stats.output_counts, stats.seen
                penalties[:, j] = (sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty)
        inputs += [bias, counts, seen, penalties]
    if allowed is not None:
        padded = np.ones((R_pad, vocab_size), bool)
        padded[:len(states)] = allowed
        inputs.append(padded)
    return variant, inputs


class BatchSampler:
    def __init__(self, buckets: list[int], new_jit=None):
        """new_jit(name, fxn): makes a variant's jit (workers/captured_steps.py stores and loads them by name)."""
        self.buckets = buckets
        self.jits: dict[tuple[int, SamplerVariant], TinyJit] = {}
        self.new_jit = new_jit or (lambda name, fxn: TinyJit(fxn))

    def jit(self, R_pad: int, variant: SamplerVariant) -> TinyJit:
        if (fn := self.jits.get((R_pad, variant))) is None:
            v = variant
            fn = self.jits[(R_pad, v)] = self.new_jit(f"sample-{R_pad}-g{v.greedy:d}p{v.processed:d}t{v.top_count}m{v.masked:d}",
                                                      sampler_body(v))
            if fn.captured is None:
                fn.cnt = 1  # its inputs are realized: capture on the first call, not run eagerly and capture on the next
        return fn

    def warm_up(self, R_pad: int, vocab_size: int, greedy: bool, logits: Tensor) -> None:
        """Runs the plain greedy or sampling variant once for bucket R_pad (callers call it twice to capture)."""
        variant = SamplerVariant(greedy, False, None)
        params = np.array([[1.0], [0.0], [1.0], [0.0]], np.float32).repeat(R_pad, 1)  # temperature, top_k, top_p, min_p
        inputs = [] if greedy else [params, np.zeros(R_pad, np.uint32), np.zeros(R_pad, np.int32)]
        host_array(self.jit(R_pad, variant)(logits[:R_pad].contiguous().realize(), *(device_tensor(a) for a in inputs))[0])

    def sample(self, states: list[RequestState], logits: Tensor,
               allowed: np.ndarray | None = None) -> tuple[list[int], list[TokenLogprobs | None]]:
        """logits [R, V] of the R rows that sample (or more rows: the first R are used) -> their tokens, and per row
        its logprobs (None if not asked). allowed: see build_inputs."""
        R, V = len(states), logits.shape[1]
        R_pad = next((b for b in self.buckets if b >= R), R)
        rows = logits.shape[0]
        # a copy, not a view of the first rows: a jit's inputs must be whole buffers
        logits = logits.pad(((0, R_pad - rows), None)) if R_pad > rows else logits[:R_pad].clone() if rows > R_pad else logits
        variant, inputs = build_inputs(states, R_pad, V, allowed)
        outs = [host_array(o) for o in self.jit(R_pad, variant)(logits.contiguous().realize(), *(device_tensor(a) for a in inputs))]
        tokens = outs[0][:R].tolist()
        if variant.top_count is None:
            return tokens, [None] * R
        chosen_lp = outs[1][:R].tolist()
        tops = (outs[2][:R].tolist(), outs[3][:R].tolist()) if variant.top_count else (None, None)
        logprobs: list[TokenLogprobs | None] = []
        for j, s in enumerate(states):
            k = s.sampling.logprobs
            logprobs.append(None if k is None else
                            to_token_logprobs([tokens[j]], [chosen_lp[j]], tops[0] and tops[0][j:j + 1],
                                              tops[1] and tops[1][j:j + 1], k)[0])
        return tokens, logprobs
