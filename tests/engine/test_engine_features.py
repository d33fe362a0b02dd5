"""Scheduler features through the real scheduler and tinygrad worker processes (tiny random model):
prefix caching, parallel sampling with copy-on-write, and preemption under KV pressure."""
import numpy as np
import pytest

from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model):
    """A roomy engine with prefix caching on (the default), shared by the tests below."""
    with LLM(tiny_model, max_num_seqs=8, num_kv_blocks=256, max_num_batched_tokens=128) as engine:
        yield engine


def prefix_prompts(n_prefix: int = 300) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(7)
    prefix = rng.integers(100, 40000, n_prefix).tolist()
    return prefix + [11, 12, 13], prefix + [21, 22, 23, 24, 25]


def test_prefix_cache_reuses_blocks_and_keeps_outputs(tiny_model, llm):
    first, second = prefix_prompts()
    llm.generate([first], GREEDY)
    cached = llm.generate([second], GREEDY)[0]
    with LLM(tiny_model, max_num_seqs=8, num_kv_blocks=256, max_num_batched_tokens=128,
             enable_prefix_caching=False) as uncached_llm:
        uncached_llm.generate([first], GREEDY)
        uncached = uncached_llm.generate([second], GREEDY)[0]
    assert cached.num_cached_tokens == 288  # 300 shared tokens -> 18 full blocks of 16
    assert uncached.num_cached_tokens == 0
    assert cached.token_ids == uncached.token_ids


def test_parallel_sampling_is_seeded_and_distinct(llm):
    prompt = prefix_prompts(40)[0]
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=1234, n=4, ignore_eos=True)
    first = llm.generate([prompt], params)[0]
    again = llm.generate([prompt], params)[0]
    other_seed = llm.generate([prompt], SamplingParams(temperature=1.0, max_tokens=10, seed=99, n=4, ignore_eos=True))[0]
    runs = [tuple(o.token_ids) for o in first.outputs]
    assert len(runs) == 4 and len(set(runs)) == 4  # four different completions
    assert runs == [tuple(o.token_ids) for o in again.outputs]  # reproducible with the same seed
    assert runs != [tuple(o.token_ids) for o in other_seed.outputs]


def test_kv_pressure_preempts_but_outputs_match(tiny_model, llm):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(100, 40000, int(n)).tolist() for n in rng.integers(20, 60, 6)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    roomy = llm.generate(prompts, params)
    with LLM(tiny_model, max_num_seqs=6, num_kv_blocks=14, max_num_batched_tokens=128) as tight_llm:  # ~3 of 6 fit at once
        tight = tight_llm.generate(prompts, params)
        assert tight_llm.stats.num_preemptions > 0
        assert tight_llm.stats.num_free_blocks == tight_llm.stats.num_total_blocks  # the pool is whole afterwards
    assert [r.token_ids for r in tight] == [r.token_ids for r in roomy]
    assert all(r.finish_reason == "length" for r in tight)
