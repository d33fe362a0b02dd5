"""Structured output on the worker: the sampler's mask (only allowed tokens are sampled, unconstrained rows are
untouched) and SamplingMasks (a matcher per request that follows its tokens, rebuilt after a preemption, EOS once
the grammar is complete) and a reasoning reply's thinking (the grammar after it, a spent budget closing it), with the
real tokenizer of the tiny test model."""
import numpy as np
import pytest
from tinygrad import Tensor

from tests.helpers.tiny_model import make_tiny_gguf
from tinyvllm.frontend.api.structured_output import choice_grammar
from tinyvllm.protocol.tokenizer import Tokenizer
from tinyvllm.protocol.sampling import SamplingParams, ThinkingParams
from tinyvllm.workers.batch_state import RequestState
from tinyvllm.workers.sampling_masks import SamplingMasks, tokenizer_for_model
from tinyvllm.workers.sampling_batch import BatchSampler, build_inputs

V = 64
SAMPLER = BatchSampler([4])


def state(sampling: SamplingParams, prompt: list[int], output: list[int] = (), eos: int = 3) -> RequestState:
    return RequestState(list(prompt) + list(output), [0], sampling, 7, len(prompt), [eos])


def test_the_mask_allows_only_its_tokens_and_leaves_other_rows_alone():
    logits = np.random.default_rng(0).standard_normal((3, V)).astype(np.float32) * 3
    rows = [state(SamplingParams(temperature=0), [1]), state(SamplingParams(temperature=1.0, seed=1), [1]),
            state(SamplingParams(temperature=0), [1])]
    allowed = np.ones((3, V), bool)
    allowed[0] = allowed[1] = False
    allowed[0, [5, 9]] = True
    allowed[1, [11, 12, 13]] = True
    variant, _ = build_inputs(rows, 4, V, allowed)
    assert variant.masked and not build_inputs(rows, 4, V)[0].masked
    plain, _ = SAMPLER.sample(rows, Tensor(logits.copy()))
    masked, _ = SAMPLER.sample(rows, Tensor(logits.copy()), allowed)
    assert masked[0] == [5, 9][int(logits[0, 9] > logits[0, 5])]
    assert masked[1] in (11, 12, 13)
    assert masked[2] == plain[2] == int(logits[2].argmax())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    tokenizer = Tokenizer.from_model_path(path)
    vocab = tokenizer.vocab_size
    return tokenizer, SamplingMasks(lambda: tokenizer_for_model(str(path), vocab)), vocab


def greedy_under_mask(masks: SamplingMasks, s: RequestState, vocab: int, steps: int) -> list[int]:
    """Picks the lowest allowed token id each step (any allowed token would do), appending it as the plan would."""
    out = []
    for _ in range(steps):
        token = int(np.flatnonzero(masks.allowed([s], vocab)[0])[0])
        out.append(token)
        if token in s.eos_token_ids:
            break
        s.append_token(token)
    return out


def test_a_request_follows_its_grammar_to_eos_and_a_resumed_one_catches_up(tiny):
    tokenizer, masks, vocab = tiny
    eos = tokenizer.eos_token_ids[0]
    sampling = SamplingParams(grammar=choice_grammar(["yes", "no thanks"], "choice"))
    s = state(sampling, [1, 2], eos=eos)
    out = greedy_under_mask(masks, s, vocab, 20)
    assert out[-1] == eos and tokenizer.decode(out[:-1]) in ("yes", "no thanks")
    # preempted after two tokens and re-sent: its outputs come back as part of the prompt
    resumed = state(sampling, [1, 2] + out[:2], eos=eos)
    resumed.num_prompt_tokens = 2
    assert greedy_under_mask(masks, resumed, vocab, 20) == out[2:]
    unconstrained = state(SamplingParams(), [1])
    assert masks.allowed([unconstrained], vocab) is None
    both = masks.allowed([unconstrained, state(sampling, [1], eos=eos)], vocab)
    assert both[0].all() and 0 < both[1].sum() < vocab


def only(masks: SamplingMasks, s: RequestState, vocab: int) -> list[int]:
    return np.flatnonzero(masks.allowed([s], vocab)[0]).tolist()


def unmasked(masks: SamplingMasks, s: RequestState, vocab: int) -> bool:
    """No mask this step: the sampler runs its unmasked variant."""
    return masks.allowed([s], vocab) is None


def think_tags(tokenizer) -> tuple[int, int]:
    """Two token ids to stand for a reasoning model's <think> and </think> (the tiny model has no such tokens;
    the worker only compares ids)."""
    start, end = tokenizer.encode("<", False), tokenizer.encode("</", False)
    assert len(start) == len(end) == 1 and start != end
    return start[0], end[0]


def test_a_grammar_waits_for_the_thinking_and_a_spent_budget_closes_it(tiny):
    tokenizer, masks, vocab = tiny
    eos = tokenizer.eos_token_ids[0]
    start, end = think_tags(tokenizer)
    grammar = choice_grammar(["yes", "no thanks"], "choice")
    s = state(SamplingParams(grammar=grammar, thinking=ThinkingParams(start, end, budget=3)), [1, 2], eos=eos)
    assert SamplingParams(thinking=ThinkingParams(start, end)).masked is False and s.sampling.masked
    allowed = masks.allowed([s], vocab)[0]  # the reply may open its thinking beside the grammar's first tokens
    assert allowed[start] and 0 < allowed.sum() < vocab
    s.append_token(start)
    for token in (5, 6, 7):  # thinking: anything, until the budget of 3 is spent
        assert unmasked(masks, s, vocab)
        s.append_token(token)
    assert only(masks, s, vocab) == [end]  # then only the closing tag
    s.append_token(end)
    out = greedy_under_mask(masks, s, vocab, 20)  # the answer follows the grammar, from its first token
    assert out[-1] == eos and tokenizer.decode(out[:-1]) in ("yes", "no thanks")


def test_a_reply_that_closes_its_thinking_itself_or_never_opens_it(tiny):
    tokenizer, masks, vocab = tiny
    eos = tokenizer.eos_token_ids[0]
    start, end = think_tags(tokenizer)
    grammar = choice_grammar(["yes", "no thanks"], "choice")
    opened = state(SamplingParams(grammar=grammar, thinking=ThinkingParams(start, end, opened=True, budget=50)),
                   [1, 2], eos=eos)
    for token in (9, start, 9, end):  # thinking, whatever it holds, until the closing tag
        assert unmasked(masks, opened, vocab)
        opened.append_token(token)
    assert tokenizer.decode(greedy_under_mask(masks, opened, vocab, 20)[:-1]) in ("yes", "no thanks")
    direct = state(SamplingParams(grammar=grammar, thinking=ThinkingParams(start, end)), [1, 2], eos=eos)
    yes = tokenizer.encode("yes", False)
    plain = state(SamplingParams(grammar=grammar), [1, 2], eos=eos)
    assert set(only(masks, direct, vocab)) == set(only(masks, plain, vocab)) | {start} and start not in \
        only(masks, plain, vocab)
    direct.append_token(yes[0])  # an answer at once: the grammar from its first token
    assert tokenizer.decode(yes + greedy_under_mask(masks, direct, vocab, 20)[:-1]) == "yes"
    no_budget_left = state(SamplingParams(thinking=ThinkingParams(start, end, opened=True, budget=0)), [1], eos=eos)
    assert only(masks, no_budget_left, vocab) == [end]
    at_the_limit = state(SamplingParams(thinking=ThinkingParams(start, end, opened=True, budget=2)), [1], eos=eos)
    for token in (9, 10):
        assert unmasked(masks, at_the_limit, vocab)
        at_the_limit.append_token(token)
    assert only(masks, at_the_limit, vocab) == [end]
    beside = masks.allowed([state(SamplingParams(), [1]), no_budget_left], vocab)  # a mask only for the row forced
    assert beside[0].all() and beside[1].sum() == 1
