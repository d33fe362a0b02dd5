"""Structured output on the worker: the sampler's mask (only allowed tokens are sampled, unconstrained rows are
untouched) and GrammarMasks (a matcher per request that follows its tokens, rebuilt after a preemption, EOS once
the grammar is complete), with the real tokenizer of the tiny test model."""
import numpy as np
import pytest
from tinygrad import Tensor

from tests.helpers.tiny_model import make_tiny_gguf
from tinyvllm.frontend.api.structured_output import choice_grammar
from tinyvllm.protocol.tokenizer import Tokenizer
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.workers.batch_state import RequestState
from tinyvllm.workers.grammar_masks import GrammarMasks, tokenizer_for_model
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
    return tokenizer, GrammarMasks(lambda: tokenizer_for_model(str(path), vocab)), vocab


def greedy_under_mask(masks: GrammarMasks, s: RequestState, vocab: int, steps: int) -> list[int]:
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
