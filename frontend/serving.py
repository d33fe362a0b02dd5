"""Per-request glue: prompt -> token ids -> engine.generate -> incremental text (with stop strings)."""
import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from frontend.openai_protocol import APIError, GenerationRequest
from protocol.messages import FinishReason

# Tokenizing or templating more characters than this runs in a thread so the event loop keeps streaming.
LONG_INPUT_CHARS = 4096


@dataclass(slots=True)
class TextDelta:
    text: str
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it; None for EOS
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0  # cumulative


class EngineRequestError(Exception):
    """The engine ended this request with finish_reason 'error'."""


class StopStringMatcher:
    """Cuts the output at the first stop string, holding back any tail that could still become one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.pending = ""

    def feed(self, text: str, final: bool) -> tuple[str, str | None]:
        """Returns (text safe to emit now, the stop string matched or None)."""
        if not self.stops:
            return text, None
        self.pending += text
        hits = [(i, s) for s in self.stops if (i := self.pending.find(s)) >= 0]
        if hits:
            i, stop = min(hits)
            out, self.pending = self.pending[:i], ""
            return out, stop
        keep = 0 if final else self._partial_match_len()
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, None

    def _partial_match_len(self) -> int:
        """Length of the longest tail of pending text that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(stop[:k]):
                    best = k
                    break
        return best


async def _maybe_in_thread(size: int, fn: Callable, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args) if size > LONG_INPUT_CHARS else fn(*args)


class RequestServing:
    def __init__(self, engine, tokenizer, max_model_len: int, make_detokenizer: Callable, metrics=None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.make_detokenizer = make_detokenizer
        self.metrics = metrics

    async def prompt_token_ids(self, req: GenerationRequest, is_chat: bool) -> list[int]:
        if is_chat:
            size = sum(len(m["content"]) for m in req.messages)
            text = await _maybe_in_thread(size, self._render_chat, req.messages)
        elif isinstance(req.prompt, list):
            self._check_token_ids(req.prompt, "prompt")
            return req.prompt
        else:
            text = req.prompt
        ids = await _maybe_in_thread(len(text), self.tokenizer.encode, text, req.add_special_tokens)
        if not ids:
            raise APIError("The prompt is empty", param="prompt" if not is_chat else "messages")
        return ids

    def _render_chat(self, messages: list[dict[str, str]]) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except Exception as e:  # the template only sees user input, so whatever it rejects is a bad request
            raise APIError(f"Could not apply the chat template: {e}", param="messages") from None

    def _check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = self.tokenizer.vocab_size
        if (bad := next((t for t in ids if not 0 <= t < vocab), None)) is not None:
            raise APIError(f"Token id {bad} in '{param}' is out of vocabulary (size {vocab})", param=param)

    def fit_to_context(self, req: GenerationRequest, num_prompt_tokens: int) -> None:
        """Checks prompt + max_tokens against max_model_len and stop ids against the vocabulary.

        Fills in chat's default max_tokens: the rest of the context."""
        limit, p = self.max_model_len, num_prompt_tokens
        if p >= limit:
            raise APIError(f"This model's maximum context length is {limit} tokens. However, your request has "
                           f"{p} input tokens. Please reduce the length of the input messages.")
        m = req.max_tokens if req.max_tokens is not None else limit - p
        if p + m > limit:
            raise APIError(f"This model's maximum context length is {limit} tokens. However, you requested "
                           f"{p + m} tokens ({p} in the messages, {m} in the completion). Please reduce the "
                           f"length of the messages or completion.", param="max_tokens")
        self._check_token_ids(req.sampling.stop_token_ids, "stop_token_ids")
        req.sampling.max_tokens = m

    async def generate_text(self, req_id: str, prompt_ids: list[int],
                            req: GenerationRequest) -> AsyncIterator[TextDelta]:
        """Text deltas as the engine produces tokens; the last one has finish_reason. Closing it aborts the request."""
        detok = self.make_detokenizer(self.tokenizer, prompt_ids, skip_special_tokens=req.skip_special_tokens)
        stops = StopStringMatcher(req.stop)
        p, generated, finish = len(prompt_ids), 0, None
        start = time.monotonic()
        outputs = self.engine.generate(req_id, prompt_ids, req.sampling, self.tokenizer.eos_token_ids)
        try:
            async for out in outputs:
                if out.finish_reason == FinishReason.ERROR:
                    finish = FinishReason.ERROR
                    raise EngineRequestError(out.error or "the engine could not serve this request")
                if generated == 0 and out.new_token_ids and self.metrics:
                    self.metrics.record_first_token(time.monotonic() - start)
                generated += len(out.new_token_ids)
                final = out.finish_reason is not None
                # A "stop" finish means the last token is EOS or a stop token id: it ends the text, never shows in it.
                shown = out.new_token_ids[:-1] if out.finish_reason == FinishReason.STOP else out.new_token_ids
                text = detok.add(shown)
                if final:
                    text += detok.flush()
                text, matched = stops.feed(text, final)
                if matched is not None:
                    finish = FinishReason.STOP
                    await outputs.aclose()  # abort now, before the consumer even sees the last delta
                    yield TextDelta(text, finish, matched, p, generated)
                    return
                if final:
                    finish = out.finish_reason
                    yield TextDelta(text, finish, self._stop_token(out.new_token_ids, req, finish), p, generated)
                    return
                if text:
                    yield TextDelta(text, None, None, p, generated)
        finally:
            await outputs.aclose()
            if self.metrics:
                self.metrics.record_finished(p, generated, finish or FinishReason.ABORT, time.monotonic() - start)

    @staticmethod
    def _stop_token(new_ids: list[int], req: GenerationRequest, finish: str) -> int | None:
        if finish == FinishReason.STOP and new_ids and new_ids[-1] in req.sampling.stop_token_ids:
            return new_ids[-1]
        return None


async def collect(deltas: AsyncIterator[TextDelta]) -> TextDelta:
    """Runs a request to the end; returns one delta holding the whole text and how it finished."""
    texts, last = [], TextDelta("")
    async with aclosing(deltas):
        async for last in deltas:
            texts.append(last.text)
    return TextDelta("".join(texts), last.finish_reason, last.stop_reason, last.num_prompt_tokens,
                     last.num_generated_tokens)
