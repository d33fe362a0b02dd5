"""The jitted sampler against numpy: logit_bias, penalties (vLLM semantics), min_p, min_tokens, logprobs of the
raw distribution, and the variant chosen for each mix of rows (greedy fast path kept when nothing else is asked)."""
import numpy as np
import pytest
from tinygrad import Tensor

from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.workers.batch_state import RequestState
from tinyvllm.workers.penalties import apply_logit_processing
from tinyvllm.workers.sampling_batch import BatchSampler, build_inputs

V = 64
EOS = 3


def state(sampling: SamplingParams, prompt: list[int], output: list[int] = (), seed: int = 0) -> RequestState:
    return RequestState(list(prompt) + list(output), [0], sampling, seed, len(prompt), [EOS])


SAMPLER = BatchSampler([2, 32])  # shared, so each (bucket, variant) compiles once for the whole file


def sample(states: list[RequestState], logits: np.ndarray):
    logits = np.broadcast_to(logits, (len(states), V)) if len(logits) == 1 else logits
    return SAMPLER.sample(states, Tensor(np.array(logits, dtype=np.float32)))  # a copy: CUDA copies in from writable memory


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.fixture
def logits():
    return np.random.default_rng(0).standard_normal((2, V)).astype(np.float32) * 3


def test_logit_bias_forces_and_forbids_tokens(logits):
    top = int(logits[0].argmax())
    forced = SamplingParams(temperature=0)
    forced.set_logit_bias({7: 100.0})
    forbidden = SamplingParams(temperature=0)
    forbidden.set_logit_bias({top: -1000.0})  # clamped to -100, still enough
    assert forbidden.logit_bias_values == [-100.0]
    tokens, _ = sample([state(forced, [1]), state(forbidden, [1])], np.stack([logits[0], logits[0]]))
    assert tokens == [7, int(np.argsort(logits[0])[-2])]


def test_logit_bias_applies_to_sampled_rows_too(logits):
    sp = SamplingParams(temperature=1.0, seed=5)
    sp.set_logit_bias({11: 100.0})
    tokens, _ = sample([state(sp, [1], seed=s) for s in (1, 2)], logits)
    assert tokens == [11, 11]


def reference_processing(logits, bias, counts, seen, presence, frequency, repetition):
    x = logits + bias
    rep = repetition[:, None]
    x = np.where(seen > 0, np.where(x > 0, x / rep, x * rep), x)
    return x - frequency[:, None] * counts - presence[:, None] * (counts > 0)


def test_penalties_match_vllm_formula():
    rng = np.random.default_rng(1)
    R = 3
    logits = rng.standard_normal((R, V)).astype(np.float32) * 2
    bias = np.where(rng.random((R, V)) < 0.1, rng.uniform(-5, 5, (R, V)), 0).astype(np.float32)
    counts = rng.integers(0, 3, (R, V)).astype(np.float32) * (rng.random((R, V)) < 0.2)
    seen = np.maximum((counts > 0), rng.random((R, V)) < 0.2).astype(np.float32)
    presence, frequency, repetition = (np.array(v, np.float32) for v in ([0.5, 0, -1], [0, 1.5, 0.3], [1.3, 1, 0.7]))
    got = apply_logit_processing(*(Tensor(a) for a in (logits, bias, counts, seen, presence, frequency, repetition)))
    np.testing.assert_allclose(got.numpy(), reference_processing(logits, bias, counts, seen, presence, frequency,
                                                                 repetition), rtol=1e-5, atol=1e-5)


def test_repetition_penalty_covers_prompt_and_output_frequency_only_output():
    logits = np.full((1, V), -5.0, np.float32)
    logits[0, [10, 20, 30]] = [3.0, 2.5, 2.0]
    # 10 is in the prompt: repetition 2 halves it (1.5) and 20 wins; frequency ignores prompt tokens.
    tokens, _ = sample([state(SamplingParams(temperature=0, repetition_penalty=2.0), [10, 1])], logits)
    assert tokens == [20]
    tokens, _ = sample([state(SamplingParams(temperature=0, frequency_penalty=2.0), [10, 1])], logits)
    assert tokens == [10]
    # 10 sampled twice before: frequency 0.4 costs 0.8 (2.2 < 2.5), presence 0.4 only 0.4 (2.6 > 2.5).
    tokens, _ = sample([state(SamplingParams(temperature=0, frequency_penalty=0.4), [1], [10, 10])], logits)
    assert tokens == [20]
    tokens, _ = sample([state(SamplingParams(temperature=0, presence_penalty=0.4), [1], [10, 10])], logits)
    assert tokens == [10]


def test_penalty_counts_follow_tokens_as_they_are_sampled():
    logits = np.full((1, V), -5.0, np.float32)
    logits[0, [10, 20]] = [3.0, 2.0]
    s = state(SamplingParams(temperature=0, frequency_penalty=0.6), [1])
    picked = []
    for _ in range(4):
        token = sample([s], logits)[0][0]
        s.append_token(token)
        picked.append(token)
    assert picked == [10, 10, 20, 10]  # 3.0, 2.4, (1.8 < 2.0), then 20 pays too: 1.4 < 1.8


def test_min_p_keeps_only_likely_tokens():
    logits = np.log(np.array([[0.4, 0.3, 0.15, 0.1, 0.05] + [1e-9] * (V - 5)], np.float32))
    sp = SamplingParams(temperature=1.0, min_p=0.5)  # keeps p >= 0.2: tokens 0 and 1
    seen = set(sample([state(sp, [1], seed=seed) for seed in range(32)], logits)[0])
    assert seen == {0, 1}


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    logits = np.zeros((1, V), np.float32)
    logits[0, [EOS, 9, 12]] = [5.0, 4.0, 3.0]
    sp = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[9], max_tokens=10)
    assert sample([state(sp, [1], [40])], logits)[0] == [12]  # one output token so far: both masked
    assert sample([state(sp, [1], [40, 41])], logits)[0] == [EOS]
    ignoring = SamplingParams(temperature=0, min_tokens=2, ignore_eos=True, max_tokens=10)
    assert sample([state(ignoring, [1])], logits)[0] == [EOS]  # ignore_eos: EOS is an ordinary token


def test_min_tokens_mask_does_not_break_top_k():
    logits = np.linspace(0, 6, V, dtype=np.float32)[None]
    sp = SamplingParams(temperature=1.0, top_k=2, min_tokens=1, stop_token_ids=[V - 1])
    got = set(sample([state(sp, [1], seed=seed) for seed in range(32)], logits)[0])
    assert got == {V - 2, V - 3}


def test_logprobs_are_log_softmax_of_the_raw_logits(logits):
    biased = SamplingParams(temperature=0, logprobs=3, repetition_penalty=1.5)
    biased.set_logit_bias({5: 50.0})
    sampled = SamplingParams(temperature=0.8, logprobs=0, seed=1)
    tokens, logprobs = sample([state(biased, [1, 2]), state(sampled, [4])], logits)
    expected = log_softmax(logits)
    assert tokens[0] == 5
    for row, (token, lp) in enumerate(zip(tokens, logprobs)):
        assert lp.token_id == token
        np.testing.assert_allclose(lp.logprob, expected[row, token], rtol=1e-4, atol=1e-4)
    assert logprobs[0].top_token_ids == np.argsort(-logits[0])[:3].tolist()
    np.testing.assert_allclose(logprobs[0].top_logprobs, np.sort(expected[0])[::-1][:3], rtol=1e-4, atol=1e-4)
    assert logprobs[1].top_token_ids == [] and logprobs[1].top_logprobs == []


def test_rows_without_logprobs_get_none(logits):
    _, logprobs = sample([state(SamplingParams(temperature=0), [1]),
                          state(SamplingParams(temperature=0, logprobs=20), [1])], logits)
    assert logprobs[0] is None and len(logprobs[1].top_token_ids) == 20


@pytest.mark.parametrize("params, expected", [
    ([SamplingParams(temperature=0)] * 2, (True, False, None)),
    ([SamplingParams(temperature=0), SamplingParams(temperature=0.5)], (False, False, None)),
    ([SamplingParams(temperature=0, presence_penalty=0.1)], (True, True, None)),
    ([SamplingParams(temperature=0, min_tokens=1)], (True, True, None)),
    ([SamplingParams(temperature=0, logprobs=2)], (True, False, 5)),
])
def test_variant_keeps_the_greedy_fast_path(params, expected):
    variant, inputs = build_inputs([state(sp, [1]) for sp in params], 2, V)
    assert (variant.greedy, variant.processed, variant.top_count) == expected
    if expected == (True, False, None):
        assert inputs == []  # argmax of the logits, nothing else sent


def test_min_tokens_reached_leaves_the_fast_path():
    variant, _ = build_inputs([state(SamplingParams(temperature=0, min_tokens=1), [1], [5])], 1, V)
    assert not variant.processed


def test_extra_logits_rows_past_the_states_are_ignored():
    """execute hands the sampler a decode batch's whole padded output: only the first len(states) rows count."""
    rows = np.random.default_rng(5).standard_normal((32, V)).astype(np.float32)
    greedy = SamplingParams(temperature=0, max_tokens=4)
    for n in (1, 2, 3):  # fewer rows than the bucket, the bucket, a larger bucket with padding rows in the logits
        tokens, _ = SAMPLER.sample([state(greedy, [1]) for _ in range(n)], Tensor(rows))
        assert tokens == rows[:n].argmax(-1).tolist()
