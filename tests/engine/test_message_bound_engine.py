"""The message bound through the real scheduler and tinygrad worker processes (tiny random model), lowered for them
by their max_message_bytes so that a few prompts' prompt logprobs are over it: requests finishing their prompts in
one step get every prompt logprob (the worker's result and the step's outputs went in parts), and a request whose
prompt logprobs alone are over the bound ends the engine with an error instead of hanging it."""
import numpy as np
import pytest

from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol import messages as m
from tinyvllm.protocol.codec import encode
from tinyvllm.protocol.sampling import SamplingParams

PROMPT_LEN, TOP = 60, 5
SAMPLING = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=TOP)


def row_bytes(num_prompt_tokens: int) -> int:
    """A StepResult with one such row, its ids and floats as large as the real ones can be (ids under 65536)."""
    lps = [m.TokenLogprobs(40000, -1.5, [40000] * TOP, [-2.5] * TOP) for _ in range(num_prompt_tokens - 1)]
    return len(encode(m.StepResult(1, 0, ["r0"], [40000], 0.5, [], [lps])))


BOUND = row_bytes(PROMPT_LEN) * 3 // 2  # one row fits, two do not


def prompts(count: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [rng.integers(100, 40000, length).tolist() for _ in range(count)]


def run(llm: LLM, batch: list[list[int]]) -> list[list[m.RequestOutput]]:
    engine, eos = llm._engine, llm.tokenizer.eos_token_ids  # the outputs themselves: LLM.generate drops logprobs

    async def collect():
        import asyncio
        async def one(i, ids):
            return [out async for out in engine.generate(f"r{i}-{len(ids)}", ids, SAMPLING, eos)]
        return await asyncio.gather(*(one(i, ids) for i, ids in enumerate(batch)))
    return llm._loop.run(collect())


def test_prompt_logprobs_over_the_bound_come_in_parts_or_end_with_an_error(tiny_model):
    batch = prompts(3, PROMPT_LEN)
    # the engine processes' bound; this process keeps 64 MiB
    with LLM(tiny_model, max_num_seqs=4, num_kv_blocks=64, max_num_batched_tokens=256,
             max_message_bytes=BOUND) as llm:
        alone = [run(llm, [ids])[0] for ids in batch]  # one row a step: under the bound
        together = run(llm, batch)  # one step prefills all three: over it
        rows = [outs[0].prompt_logprobs for outs in together]
        assert len(encode(m.StepResult(1, 0, ["r"] * 3, [1] * 3, 0.0, [], rows))) > BOUND
        for got, expected, ids in zip(together, alone, batch):
            assert [lp.token_id for lp in got[0].prompt_logprobs] == ids[1:]
            assert [o.new_token_ids for o in got] == [o.new_token_ids for o in expected]
            assert [o.finish_reason for o in got] == [None, "length"]
            assert [lp.top_token_ids for lp in got[0].prompt_logprobs] == \
                [lp.top_token_ids for lp in expected[0].prompt_logprobs]
            np.testing.assert_allclose([lp.logprob for lp in got[0].prompt_logprobs],
                                       [lp.logprob for lp in expected[0].prompt_logprobs], atol=1e-4)
        assert llm.stats.num_free_blocks == llm.stats.num_total_blocks

        long_prompt = prompts(1, PROMPT_LEN * 2)[0]
        assert row_bytes(len(long_prompt)) > BOUND
        with pytest.raises(EngineDeadError, match="process died"):  # not "stopped answering": nothing hung
            llm.generate([long_prompt], SAMPLING)
