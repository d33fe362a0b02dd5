"""CPU swap (--swap-space) through the real scheduler and tinygrad worker process (tiny random model): under KV
pressure preempted requests are swapped out and back, nothing is recomputed, and greedy outputs equal a roomy run's."""
import numpy as np

from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.workers.kv_cache import bytes_per_block

ENGINE = dict(max_num_seqs=6, max_num_batched_tokens=256)  # every prompt below is computed in one piece


def test_preempted_requests_are_swapped_back_not_recomputed(tiny_model):
    rng = np.random.default_rng(5)
    prompts = [rng.integers(100, 40000, int(n)).tolist() for n in rng.integers(40, 60, 6)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    each_token_once = sum(len(p) + params.max_tokens - 1 for p in prompts)  # the last sampled token is never fed
    with LLM(tiny_model, num_kv_blocks=256, **ENGINE) as roomy_llm:
        roomy = roomy_llm.generate(prompts, params)
        assert roomy_llm.stats.num_preemptions == 0 and roomy_llm.stats.num_tokens_computed == each_token_once
    # 14 blocks of 16 hold two of these requests whole; 1 MiB holds 256 of the tiny model's 4 KiB blocks (float16)
    swap_slots = (1 << 20) // bytes_per_block(read_model_config(tiny_model), 16, "auto")
    with LLM(tiny_model, num_kv_blocks=14, swap_space=1 << 20, **ENGINE) as tight_llm:
        tight = tight_llm.generate(prompts, params)
        stats = tight_llm.stats
    assert stats.num_preemptions > 0 and stats.num_swapped_out_blocks > 0
    assert stats.num_tokens_computed == each_token_once  # no prompt or output token computed twice
    assert stats.num_swapped_in_blocks == stats.num_swapped_out_blocks
    assert stats.num_free_swap_slots == stats.num_swap_slots == swap_slots and stats.num_free_blocks == stats.num_total_blocks
    assert [r.token_ids for r in tight] == [r.token_ids for r in roomy]
