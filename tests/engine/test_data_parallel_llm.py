"""The offline LLM over two data-parallel replicas (real schedulers and workers, tiny random model): prompts spread
over both, and the same prompt gets the same greedy tokens on either."""

from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def test_two_replicas_share_the_prompts_and_agree(tiny_model):
    first, second = [5, 300, 7000], [9, 8, 7, 6]  # shorter than a block: balanced by load alone
    with LLM(tiny_model, data_parallel_size=2, max_num_seqs=4, num_kv_blocks=32, max_model_len=128) as llm:
        results = llm.generate([first, first, second, second], GREEDY)
        queried = {engine: s.prefix_cache_queries for engine, s in llm._engine.stats_by_engine().items()}
    assert queried == {"0": len(first) + len(second), "1": len(first) + len(second)}
    assert [len(r.token_ids) for r in results] == [8] * 4
    assert results[0].token_ids == results[1].token_ids and results[2].token_ids == results[3].token_ids
