"""The tokens each row may sample next, on the sampling worker, as an [R, V] mask: structured output (one
llguidance matcher per constrained request, advanced with every token the request gets) and a reasoning model's
thinking (workers/thinking_phase.py: the grammar applies after it; a spent thinking budget allows only the closing
tag).

The matcher lives here, where the request's tokens are known in order. It catches up lazily, just before a mask is
computed, on whatever output tokens it has not consumed yet: the token sampled last step, or every output token of
a request preempted and re-sent as new (its outputs then arrive as part of the prompt, past num_prompt_tokens).
Once the grammar is complete the mask allows only EOS, so the request stops the way any request does.

Only masked rows (SamplingParams.masked) cost anything; a step without one never calls in here (see
model_runner.execute).
"""
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llguidance import LLMatcher, LLTokenizer
from llguidance.numpy import fill_next_token_bitmask

from tinyvllm.workers.thinking_phase import ThinkingPhase

log = logging.getLogger(__name__)
COMPILED_CACHE_SIZE = 64  # compiled grammars kept by their text: requests with the same schema compile once


@dataclass(slots=True)
class GrammarState:
    matcher: LLMatcher
    num_consumed: int = 0  # output tokens the matcher has consumed


def tokenizer_for_model(model_path: str | None, vocab_size: int) -> LLTokenizer:
    """The model's tokenizer as llguidance needs it (about a second to build: done once, on first use)."""
    from tinyvllm.protocol.tokenizer import Tokenizer
    tokenizer = Tokenizer.from_model_path(model_path)
    return LLTokenizer(tokenizer.hf.to_str(), n_vocab=vocab_size, eos_token=tokenizer.eos_token_ids)


class SamplingMasks:
    def __init__(self, load_tokenizer: Callable[[], LLTokenizer]):
        self._load_tokenizer = load_tokenizer
        self._tokenizer: LLTokenizer | None = None
        self._compiled: OrderedDict[str, LLMatcher] = OrderedDict()

    @property
    def tokenizer(self) -> LLTokenizer:
        if self._tokenizer is None:
            self._tokenizer = self._load_tokenizer()
        return self._tokenizer

    def _new_matcher(self, grammar: str) -> LLMatcher:
        """A fresh matcher: a copy of the cached compiled one (deep_copy skips compiling)."""
        compiled = self._compiled.get(grammar)
        if compiled is None:
            compiled = LLMatcher(self.tokenizer, grammar, log_level=0)
            self._compiled[grammar] = compiled
            if len(self._compiled) > COMPILED_CACHE_SIZE:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(grammar)
        return compiled.deep_copy()

    def _matcher(self, state) -> GrammarState:
        if state.grammar is None:
            state.grammar = GrammarState(self._new_matcher(state.sampling.grammar))
        return state.grammar

    def _synced(self, state, answer_start: int) -> LLMatcher:
        """state's matcher, after it consumed every output token of the answer (which begins at output token
        answer_start) it had not seen."""
        grammar = self._matcher(state)
        new = state.token_ids[state.num_prompt_tokens + answer_start + grammar.num_consumed:]
        # a stopped matcher (the grammar is complete) takes no more tokens: what follows is EOS, or tokens of a
        # step scheduled before the scheduler saw that EOS
        if new and not grammar.matcher.is_stopped() and not grammar.matcher.is_error() \
                and not grammar.matcher.consume_tokens(new):
            log.warning("structured output: a token the grammar does not allow: %s", grammar.matcher.get_error())
        grammar.num_consumed += len(new)
        return grammar.matcher

    @staticmethod
    def _thinking(state) -> ThinkingPhase | None:
        """state's thinking phase, after it saw every output token; None when the request is no reasoning reply."""
        if state.sampling.thinking is None:
            return None
        if state.thinking is None:
            state.thinking = ThinkingPhase.of(state.sampling.thinking)
        state.thinking.advance(state.token_ids[state.num_prompt_tokens:])
        return state.thinking

    def allowed(self, states: list, vocab_size: int) -> np.ndarray | None:
        """[R, V] bool, True where row j may sample the token; None when no row is masked, or none restricts its
        tokens this step. Rows without a mask, and rows still thinking within their budget, allow everything. A stopped matcher (complete) or one in an error
        state allows EOS only: the request ends."""
        rows = [(j, s) for j, s in enumerate(states) if s.sampling.masked]
        if not rows:
            return None
        words = np.full((len(states), (vocab_size + 31) // 32), -1, np.int32)
        ended, only, also, filled = [], {}, {}, []  # EOS-only rows; j -> the one token; j -> a token more; masked
        # one thread below: a pool's spinning threads would slow the CPU backend's kernels
        for j, s in rows:
            thinking = self._thinking(s)
            if thinking is not None and (token := thinking.forced()) is not None:
                only[j] = token
            elif s.sampling.grammar is None or (thinking is not None and thinking.phase == "thinking"):
                continue
            else:
                if thinking is not None and thinking.phase == "start":  # no output yet: the answer, or the thinking
                    also[j] = thinking.params.start_id  # (an empty grammar: EOS, or the opening tag)
                matcher = self._synced(s, thinking.answer_start if thinking is not None else 0)
                if matcher.is_error() or matcher.is_stopped():
                    ended.append(j)
                else:
                    fill_next_token_bitmask(matcher, words, j)
                    filled.append(j)
        if not (filled or ended or only):  # rows thinking within their budget, or answering with no grammar
            return None
        allowed = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab_size].astype(bool)
        for j in ended:
            allowed[j] = False
            allowed[j, [t for t in states[j].eos_token_ids if 0 <= t < vocab_size]] = True
        for j, token in also.items():
            if 0 <= token < vocab_size:
                allowed[j, token] = True
        for j, token in only.items():
            allowed[j] = False
            allowed[j, token if 0 <= token < vocab_size else states[j].eos_token_ids[0]] = True
        return allowed
