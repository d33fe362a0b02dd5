"""Async scheduling through the real scheduler and tinygrad worker processes (tiny random model): several concurrent
requests with different max_tokens, one ended early by a stop token, one with penalties, one with logprobs, one
seeded, come out token for token (and logprob for logprob) as with async scheduling off, and the pool is whole."""
import numpy as np

from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.sampling import SamplingParams

ENGINE = dict(max_num_seqs=4, num_kv_blocks=64, max_num_batched_tokens=64)  # 6 requests: 2 wait for seats


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(11)
    return [rng.integers(100, 40000, int(n)).tolist() for n in (9, 30, 17, 5, 50, 12)]


def params(stop_token: int | None = None) -> list[SamplingParams]:
    greedy = dict(temperature=0, ignore_eos=True)
    return [SamplingParams(max_tokens=20, **greedy),
            SamplingParams(max_tokens=24, stop_token_ids=[stop_token] if stop_token is not None else [], **greedy),
            SamplingParams(max_tokens=7, logprobs=3, **greedy),
            SamplingParams(max_tokens=16, repetition_penalty=1.3, frequency_penalty=0.6, presence_penalty=0.4,
                           **greedy),
            SamplingParams(max_tokens=1, **greedy),
            SamplingParams(max_tokens=13, temperature=0.8, seed=5, ignore_eos=True)]


def run(llm: LLM, sampling: list[SamplingParams]) -> list[list]:
    """Each request's RequestOutputs, all sent at once (the engine batches them)."""
    engine, eos = llm._engine, llm.tokenizer.eos_token_ids  # the outputs themselves: LLM.generate drops logprobs

    async def collect():
        import asyncio
        async def one(i, ids, sp):
            return [out async for out in engine.generate(f"r{i}", ids, sp, eos)]
        return await asyncio.gather(*(one(i, ids, sp) for i, (ids, sp) in enumerate(zip(prompts(), sampling))))
    return llm._loop.run(collect())


def summary(outputs: list) -> tuple:
    tokens = [t for out in outputs for t in out.new_token_ids]
    logprobs = [lp for out in outputs for lp in out.logprobs or []]
    return tokens, outputs[-1].finish_reason, [(lp.token_id, lp.top_token_ids) for lp in logprobs], \
        [lp.logprob for lp in logprobs]


def test_async_scheduling_changes_no_output(tiny_model):
    with LLM(tiny_model, async_scheduling=False, **ENGINE) as llm:
        free = run(llm, params())
        tokens = summary(free[1])[0]
        # a stop token at the first token that does not come earlier: request 1 ends there, early
        stop_at = next(i for i in range(3, len(tokens)) if tokens[i] not in tokens[:i])
        expected = [summary(outs) for outs in run(llm, params(tokens[stop_at]))]
    assert expected[1][:2] == (tokens[:stop_at + 1], "stop")
    assert [len(e[0]) for e in expected] == [20, stop_at + 1, 7, 16, 1, 13] and len(expected[2][2]) == 7
    with LLM(tiny_model, async_scheduling=True, **ENGINE) as llm:
        got = [summary(outs) for outs in run(llm, params(tokens[stop_at]))]
        assert llm.stats.num_free_blocks == llm.stats.num_total_blocks
    for g, e in zip(got, expected):
        assert g[:3] == e[:3]
        np.testing.assert_allclose(g[3], e[3], atol=1e-4)
