"""What `LLM.generate` returns per prompt, and the bookkeeping that gathers it from a request's outputs."""
from dataclasses import dataclass, field

from tinyvllm.frontend.engine.request_completion import RequestCompletion
from tinyvllm.protocol.tokenizer import Tokenizer
from tinyvllm.protocol.messages import RequestOutput, TokenLogprobs


@dataclass(slots=True)
class CompletionOutput:
    """One of a prompt's n samples."""
    index: int
    token_ids: list[int]
    text: str
    finish_reason: str | None  # None: never finished, because another sample of the request failed
    logprobs: list[TokenLogprobs] | None = None  # one per token, when SamplingParams.logprobs is set


@dataclass(slots=True)
class GenerationResult:
    """A prompt's result: every sample in `outputs` (SamplingParams.n of them, by index); `token_ids`, `text`
    and `finish_reason` repeat the first sample's. `error` is set when the request ended with an error."""
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    error: str | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache


class SampleCollector:
    """Gathers one request's outputs, per sample index, until every sample finished or one failed."""

    def __init__(self, n: int):
        self.completion = RequestCompletion(n)
        self.token_ids: list[list[int]] = [[] for _ in range(n)]
        self.finish_reasons: list[str | None] = [None] * n
        self.logprobs: list[list[TokenLogprobs] | None] = [None] * n
        self.num_cached_tokens = 0

    def add(self, out: RequestOutput) -> None:
        self.completion.observe(out)
        self.token_ids[out.index] += out.new_token_ids
        if out.logprobs is not None:
            self.logprobs[out.index] = (self.logprobs[out.index] or []) + out.logprobs
        if out.index == 0:
            self.num_cached_tokens = out.num_cached_tokens
        if out.finish_reason is not None:
            self.finish_reasons[out.index] = out.finish_reason

    def result(self, prompt_token_ids: list[int], tokenizer: Tokenizer) -> GenerationResult:
        outputs = [CompletionOutput(i, ids, tokenizer.decode(ids), reason, logprobs)
                   for i, (ids, reason, logprobs) in enumerate(zip(self.token_ids, self.finish_reasons, self.logprobs))]
        first = outputs[0]
        return GenerationResult(prompt_token_ids, first.token_ids, first.text, first.finish_reason,
                                self.completion.error, outputs, self.num_cached_tokens)
