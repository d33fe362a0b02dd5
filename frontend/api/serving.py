"""Per-request glue: prompt -> token ids -> engine.generate -> incremental text per choice (with stop strings)."""
import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from tinyvllm.frontend.api import logprobs as lp
from tinyvllm.frontend.api.choice_text import ChoiceText
from tinyvllm.frontend.api.openai_protocol import APIError, GenerationRequest
from tinyvllm.frontend.api.reasoning import ReasoningFormat, with_reasoning
from tinyvllm.frontend.engine.request_errors import EngineRequestError
from tinyvllm.frontend.api.tool_calls import template_messages
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.protocol.sampling import MAX_LOGPROB_ENTRIES, SamplingParams, ThinkingParams

# Tokenizing or templating more characters than this runs in a thread so the event loop keeps streaming.
LONG_INPUT_CHARS = 4096


@dataclass(slots=True)
class TextDelta:
    text: str
    index: int = 0  # which choice (n > 1)
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it; None for EOS
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0  # cumulative over all choices
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    logprobs: dict | None = None  # this delta's tokens, in the endpoint's format (frontend/api/logprobs.py)
    kv_transfer_params: dict | None = None  # a prefill instance's last delta: where the prompt's KV waits
    cumulative_logprob: float = 0.0  # this choice's tokens so far, when the engine reported their logprobs
    tool_calls: list[dict] | None = None  # chat with tools: the choice's calls, on its last delta
    reasoning: str = ""  # chat with a reasoning parser: thinking, apart from the answer in text


@dataclass(slots=True)
class ChoiceResult:
    index: int
    text: str
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: dict | None = None
    cumulative_logprob: float = 0.0
    reasoning: str | None = None  # None: the reply did not think (or no reasoning parser)


@dataclass(slots=True)
class CompletionResult:
    choices: list[ChoiceResult]
    num_prompt_tokens: int
    num_generated_tokens: int  # over all choices
    num_cached_tokens: int
    kv_transfer_params: dict | None = None


async def _maybe_in_thread(size: int, fn: Callable, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args) if size > LONG_INPUT_CHARS else fn(*args)


class RequestServing:
    def __init__(self, engine, tokenizer, max_model_len: int, make_detokenizer: Callable, metrics=None,
                 default_max_tokens: int | None = None, reasoning: ReasoningFormat | None = None):
        self.engine = engine
        self.reasoning = reasoning  # chat replies' thinking apart from their answer (frontend/api/reasoning.py)
        self.default_max_tokens = default_max_tokens  # chat requests with no limit of their own; None: the context
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.make_detokenizer = make_detokenizer
        self.metrics = metrics
        self.token_text = lp.TokenText(tokenizer)
        self._thinking_tags = self._single_token_tags()  # the think tags' ids; None: no reasoning, or not single tokens

    async def prompt_token_ids(self, req: GenerationRequest, is_chat: bool) -> list[int]:
        if is_chat:
            size = sum(len(m["content"]) for m in req.messages)
            text = await _maybe_in_thread(size, self._render_chat, req.messages, req.tools.functions,
                                          req.template_kwargs)
            req.reasoning_opened = self.reasoning is not None and self.reasoning.opened_by(text)
            closed = self.reasoning is not None and self.reasoning.closed_by(text)
            req.sampling.thinking = self.thinking_params(req.reasoning_opened, req.thinking_budget, closed)
        elif isinstance(req.prompt, list):
            self._check_token_ids(req.prompt, "prompt")
            return req.prompt
        else:
            text = req.prompt
        ids = await _maybe_in_thread(len(text), self.tokenizer.encode, text, req.add_special_tokens)
        if not ids:
            raise APIError("The prompt is empty", param="prompt" if not is_chat else "messages")
        return ids

    def _single_token_tags(self) -> tuple[int, int] | None:
        if self.reasoning is None:
            return None
        ids = [self.tokenizer.encode(tag, False) for tag in (self.reasoning.start, self.reasoning.end)]
        if all(len(i) == 1 and 0 <= i[0] < self.tokenizer.vocab_size for i in ids):
            return ids[0][0], ids[1][0]
        return None

    def follows_thinking(self) -> bool:
        """Whether the worker can follow this model's thinking (a reasoning format whose tags are single tokens):
        what a thinking budget and a grammar after the thinking need."""
        return self._thinking_tags is not None

    def thinking_params(self, opened: bool, budget: int | None, closed: bool = False) -> ThinkingParams | None:
        """A templated reply's thinking as the worker follows it (grammars after it, the budget); None: the model
        does not think, or not in this reply (closed: the prompt closed the think block), or its tags are no single
        tokens, which the worker could not see reliably in the reply's tokens (a 400 if a budget was asked for)."""
        if self.reasoning is None:
            if budget is not None:
                raise APIError("thinking_token_budget needs a reasoning model: the served model's chat template does "
                               "not think (--reasoning-parser)", param="thinking_token_budget")
            return None
        if closed:
            return None
        if not self.follows_thinking():
            if budget is not None:
                raise APIError(f"thinking_token_budget needs the model's {self.reasoning.start} and "
                               f"{self.reasoning.end} to be single tokens, and they are not", param="thinking_token_budget")
            return None
        start_id, end_id = self._thinking_tags
        return ThinkingParams(start_id, end_id, opened or self.reasoning.thinks_first, budget)

    def _render_chat(self, messages: list[dict], functions: list[dict], template_kwargs: dict) -> str:
        messages, extra = template_messages(messages, functions, self.tokenizer.chat_template)
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **template_kwargs, **extra)
        except Exception as e:  # the template only sees user input, so whatever it rejects is a bad request
            raise APIError(f"Could not apply the chat template: {e}", param="messages") from None

    def _check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = self.tokenizer.vocab_size
        if (bad := next((t for t in ids if not 0 <= t < vocab), None)) is not None:
            raise APIError(f"Token id {bad} in '{param}' is out of vocabulary (size {vocab})", param=param)

    def fit_to_context(self, req: GenerationRequest, num_prompt_tokens: int) -> None:
        """Checks prompt + max_tokens against max_model_len and stop ids against the vocabulary.

        Fills in chat's default max_tokens: the rest of the context, or --default-max-tokens if that is less."""
        limit, p = self.max_model_len, num_prompt_tokens
        if p >= limit:
            raise APIError(f"This model's maximum context length is {limit} tokens. However, your request has "
                           f"{p} input tokens. Please reduce the length of the input messages.")
        m = req.max_tokens if req.max_tokens is not None else min(limit - p, self.default_max_tokens or limit)
        if p + m > limit:
            raise APIError(f"This model's maximum context length is {limit} tokens. However, you requested "
                           f"{p + m} tokens ({p} in the messages, {m} in the completion). Please reduce the "
                           f"length of the messages or completion.", param="max_tokens")
        self._check_token_ids(req.sampling.stop_token_ids, "stop_token_ids")
        vocab = self.tokenizer.vocab_size
        if bad := sorted(t for t in req.sampling.logit_bias_token_ids if not 0 <= t < vocab):
            raise APIError(f"token_id(s) {bad} in logit_bias contain out-of-vocab token ids. Vocabulary size: "
                           f"{vocab}", param="logit_bias")
        req.sampling.max_tokens = m
        if req.sampling.min_tokens > m:
            raise APIError(f"min_tokens must be less than or equal to max_tokens={m}, got {req.sampling.min_tokens}.",
                           param="min_tokens")
        self._check_logprobs_volume(req.sampling, p, req.logprobs_only_to_rank)

    def _check_logprobs_volume(self, sp: SamplingParams, num_prompt_tokens: int, only_to_rank: bool) -> None:
        if (entries := sp.num_logprob_entries(num_prompt_tokens)) <= MAX_LOGPROB_ENTRIES:
            return
        if only_to_rank:  # the logprobs best_of ranks by: one per generated token of every candidate
            raise APIError(f"best_of={sp.n} candidates of up to {sp.max_tokens} tokens are {entries} tokens to rank, "
                           f"more than the {MAX_LOGPROB_ENTRIES} one request may have. Please ask for a smaller "
                           "best_of or fewer tokens.", param="best_of")
        terms = ([f"{num_prompt_tokens} prompt tokens x {sp.prompt_logprobs + 1}"] if sp.prompt_logprobs is not None
                 else []) + ([f"{sp.max_tokens} tokens x {sp.logprobs + 1}"] if sp.logprobs is not None else [])
        raise APIError(f"This request would return up to {entries} logprobs entries (n={sp.n} x "
                       f"({' + '.join(terms)})), more than the {MAX_LOGPROB_ENTRIES} one request may have. Please ask "
                       "for fewer logprobs, fewer tokens or a shorter prompt.", param="logprobs")

    def echo_text(self, req: GenerationRequest, prompt_ids: list[int]) -> str:
        """What goes before each choice's text when echo is asked for (see GenerationRequest.echo)."""
        if not req.echo:
            return ""
        if req.is_chat:
            last = req.messages[-1]
            return last["content"] if last["role"] == "assistant" else ""
        return req.prompt if isinstance(req.prompt, str) else self.tokenizer.decode(prompt_ids)

    def generate_reply(self, req_id: str, prompt_ids: list[int], req: GenerationRequest) -> AsyncIterator[TextDelta]:
        """generate_text's deltas for a templated reply: a thinking model's thinking goes to each delta's
        `reasoning`, apart from the answer's text."""
        deltas = self.generate_text(req_id, prompt_ids, req)
        if self.reasoning is None:
            return deltas
        return with_reasoning(deltas, req.sampling.n, self.reasoning, req.reasoning_opened)

    async def generate_text(self, req_id: str, prompt_ids: list[int],
                            req: GenerationRequest) -> AsyncIterator[TextDelta]:
        """Text deltas of every choice (TextDelta.index) as the engine produces tokens. Each choice's last delta
        has its finish_reason; the generator ends once every choice has one. Closing it aborts the request."""
        sp = req.sampling
        choices = [ChoiceText(i, self.make_detokenizer(self.tokenizer, prompt_ids,
                                                       skip_special_tokens=req.skip_special_tokens),
                              req.stop, sp.stop_token_ids, req.include_stop_str_in_output, sp.min_tokens)
                   for i in range(sp.n)]
        shown = sp.logprobs is not None and not req.logprobs_only_to_rank
        logprobs = [lp.ChoiceLogprobs(self.token_text, req.is_chat, sp.logprobs) if shown else None
                    for _ in range(sp.n)]
        cumulative = [0.0] * sp.n
        echo = [self.echo_text(req, prompt_ids)] * sp.n  # each choice's, until its first delta takes it
        p, generated, cached, errored = len(prompt_ids), 0, 0, False
        kv_params = None

        def delta(choice: ChoiceText, text: str, final: bool) -> TextDelta:
            i = choice.index
            text, echo[i] = echo[i] + text, ""
            body = logprobs[i].take() if logprobs[i] is not None else None
            return TextDelta(text, i, choice.finish_reason if final else None, choice.stop_reason if final else None,
                             p, generated, cached, body, kv_params if final else None, cumulative[i])

        start = time.monotonic()
        outputs = self.engine.generate(req_id, prompt_ids, req.sampling, self.tokenizer.eos_token_ids)
        try:
            async for out in outputs:
                if out.finish_reason == FinishReason.ERROR:
                    errored = True
                    raise EngineRequestError.from_output(out)
                choice = choices[out.index]
                if choice.finished:
                    # Stopped by a stop string: the engine can only abort the whole request, which its
                    # siblings still need, so this child runs on and its tokens are dropped here.
                    continue
                if generated == 0 and out.new_token_ids and self.metrics:
                    self.metrics.record_first_token(time.monotonic() - start)
                generated += len(out.new_token_ids)
                if out.kv_transfer is not None:
                    kv_params = dataclasses.asdict(out.kv_transfer)
                if out.index == 0:
                    cached = out.num_cached_tokens  # the leader's: it looked the prompt up in the prefix cache
                cumulative[out.index] += sum(entry.logprob for entry in out.logprobs or [])
                if (choice_lps := logprobs[out.index]) is not None:
                    if choice.num_tokens == 0 and sp.prompt_logprobs is not None:  # echo: the prompt's come first
                        choice_lps.add(prompt_ids, [None] + (out.prompt_logprobs or []))
                    choice_lps.add(out.new_token_ids, out.logprobs)
                text = choice.feed(out)
                if not choice.finished:
                    if text:
                        yield delta(choice, text, final=False)
                    continue
                all_finished = all(c.finished for c in choices)
                if all_finished:
                    await outputs.aclose()  # abort stopped children now, before the consumer sees the last delta
                yield delta(choice, text, final=True)
                if all_finished:
                    return
        finally:
            await outputs.aclose()
            if self.metrics:
                unfinished = FinishReason.ERROR if errored else FinishReason.ABORT
                self.metrics.record_finished(p, generated, [c.finish_reason or unfinished for c in choices],
                                             time.monotonic() - start)


async def collect(deltas: AsyncIterator[TextDelta], n: int) -> CompletionResult:
    """Runs a request to the end; returns every choice's whole text and how it finished, and the token counts."""
    texts: list[list[str]] = [[] for _ in range(n)]
    thoughts: list[list[str]] = [[] for _ in range(n)]
    choices = [ChoiceResult(i, "") for i in range(n)]
    last = TextDelta("")
    async with aclosing(deltas):
        async for last in deltas:
            texts[last.index].append(last.text)
            if last.reasoning:
                thoughts[last.index].append(last.reasoning)
            choices[last.index].logprobs = lp.merge(choices[last.index].logprobs, last.logprobs)
            choices[last.index].cumulative_logprob = last.cumulative_logprob
            if last.finish_reason is not None:
                choices[last.index].finish_reason = last.finish_reason
                choices[last.index].stop_reason = last.stop_reason
    for choice, pieces, thought in zip(choices, texts, thoughts):
        choice.text, choice.reasoning = "".join(pieces), "".join(thought) if thought else None
    return CompletionResult(choices, last.num_prompt_tokens, last.num_generated_tokens, last.num_cached_tokens,
                            last.kv_transfer_params)


def keep_best(result: CompletionResult, n: int) -> CompletionResult:
    """best_of: the n choices with the highest cumulative logprob, best first and re-indexed. The usage still counts
    every candidate's tokens: they were all generated."""
    best = sorted(result.choices, key=lambda c: c.cumulative_logprob, reverse=True)[:n]
    return dataclasses.replace(result, choices=[dataclasses.replace(c, index=i) for i, c in enumerate(best)])
