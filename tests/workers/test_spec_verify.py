"""Draft verification in ModelRunner (workers/spec_verify.py) on a tiny random model: the token at a position where a
draft is verified is distributed as without speculation (a chi-square test over many seeds cannot tell them apart),
a seeded request samples the very same token, and a greedy request gets the argmax tokens."""
import math
from collections import Counter

import numpy as np
import pytest

from tinyvllm.protocol.messages import CachedRequestData, NewRequestData, StepPlan
from tinyvllm.protocol.sampling import SamplingParams
from tests.workers.dense_reference import dense_logits, random_llama
from tests.workers.test_paged_attention import CFG
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.model_runner import ModelRunner

ROWS, BATCHES = 32, 8
PROMPT = [5, 17, 42, 8, 5, 17, 42]


@pytest.fixture(scope="module")
def setup():
    weights = random_llama(CFG, seed=4)
    weights["output.weight"] = np.random.default_rng(5).standard_normal((CFG.vocab_size, CFG.dim)).astype(np.float32) * 0.3
    model = Transformer(CFG, weights, CFG.max_context)
    runner = ModelRunner(model, PagedKVCache(CFG, 3 * ROWS + 1, 4), max_num_seqs=ROWS, max_model_len=64,
                         max_num_batched_tokens=4 * ROWS)
    return weights, runner


class Steps:
    def __init__(self, runner):
        self.runner, self.step_id = runner, 0

    def run(self, new=(), cached=(), finished=()):
        self.step_id += 1
        return self.runner.execute(StepPlan(self.step_id, list(new), list(cached), list(finished)))


def next_tokens(steps: Steps, samplings: list[SamplingParams], drafts: list[int]) -> list[list[int]]:
    """Per request: the tokens its step after the prompt yields (accepted drafts, then the sampled token)."""
    ids = [f"r{i}" for i in range(len(samplings))]
    steps.run(new=[NewRequestData(r, PROMPT, sp, [3 * i, 3 * i + 1, 3 * i + 2], 0, len(PROMPT) - 1)
                   for i, (r, sp) in enumerate(zip(ids, samplings))])
    result = steps.run(cached=[CachedRequestData(r, [], len(PROMPT) - 1, 1 + len(drafts), draft_token_ids=drafts)
                               for r in ids])
    steps.run(finished=ids)
    assert result.req_ids == ids
    accepted = result.accepted_draft_ids or [[] for _ in ids]
    return [a + [t] for a, t in zip(accepted, result.sampled_token_ids)]


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at 1 - 0.001 (z: the normal's), Wilson-Hilferty's approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def homogeneity_statistic(a: Counter, b: Counter) -> tuple[float, int]:
    """Two samples' chi-square statistic (tokens seen under 10 times in both lumped together) and its dof."""
    tokens = sorted(set(a) | set(b))
    frequent = [t for t in tokens if a[t] + b[t] >= 10]
    rows = [[a[t] for t in frequent] + [sum(a[t] for t in tokens if t not in frequent)],
            [b[t] for t in frequent] + [sum(b[t] for t in tokens if t not in frequent)]]
    table = np.array(rows, float)
    table = table[:, table.sum(0) > 0]
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum()), table.shape[1] - 1


def test_verified_position_samples_the_target_distribution(setup):
    weights, runner = setup
    steps = Steps(runner)
    probs = np.exp(dense_logits(CFG, weights, PROMPT)[-1])
    probs /= probs.sum()
    likely, other = (int(t) for t in np.argsort(-probs)[:2])
    drafts = [likely, other, likely]  # the first is accepted often, the rest now and then
    plain, spec, accepted = Counter(), Counter(), 0
    for batch in range(BATCHES):
        seeds = [batch * ROWS + i for i in range(ROWS)]
        same_seeds = [SamplingParams(temperature=1.0, seed=s) for s in seeds]
        without = next_tokens(steps, same_seeds, [])
        with_drafts = next_tokens(steps, same_seeds, drafts)
        assert all(w[:1] == d[:len(w)] for w, d in zip(without, with_drafts))  # a seed samples the same token
        other_seeds = [SamplingParams(temperature=1.0, seed=10**6 + s) for s in seeds]
        plain.update(t[0] for t in without)
        spec.update(t[0] for t in next_tokens(steps, other_seeds, drafts))
        accepted += sum(len(t) > 1 for t in with_drafts)
    assert 0 < accepted < BATCHES * ROWS
    stat, dof = homogeneity_statistic(plain, spec)
    assert dof >= 3 and stat < chi_square_critical(dof), (stat, dof)
    assert abs(plain[likely] / (BATCHES * ROWS) - probs[likely]) < 0.1  # and both are the model's distribution


def test_greedy_drafts_yield_the_argmax_tokens(setup):
    weights, runner = setup
    greedy = dense_logits(CFG, weights, PROMPT)[-1].argmax()
    second = int(dense_logits(CFG, weights, PROMPT + [int(greedy)])[-1].argmax())
    wrong = (second + 1) % CFG.vocab_size
    rows = next_tokens(Steps(runner), [SamplingParams(temperature=0)] * 2, [int(greedy), second, wrong])
    third = int(dense_logits(CFG, weights, PROMPT + [int(greedy), second])[-1].argmax())
    assert rows[0] == rows[1] == [int(greedy), second, third]  # two drafts accepted, the third replaced



def test_draft_logits_are_a_buffer_of_their_own(setup, monkeypatch):
    """The sampler's jit takes the draft positions' logits as its input buffer. A view of the DraftLogits jit's
    output (what contiguous() of its leading rows is) would be captured as that jit's buffer and read again on
    replay, even when the next step's logits come from another bucket's jit: stale logits, drafts wrongly accepted."""
    from tinygrad.uop.ops import Ops
    _, runner = setup
    outputs = []
    original = runner.draft_logits.__class__.__call__
    monkeypatch.setattr(runner.draft_logits.__class__, "__call__",
                        lambda self, batch, hidden: outputs.append(original(self, batch, hidden)) or outputs[-1])
    next_tokens(Steps(runner), [SamplingParams(temperature=0)] * 3, [5, 6])
    (out,) = [o for o in outputs if o is not None]
    assert out.shape[0] == 6 and out.uop.op is Ops.BUFFER or (out.uop.op is Ops.RESHAPE and out.uop.src[0].op is Ops.BUFFER)
