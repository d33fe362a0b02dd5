"""Automatic prefix caching through the scheduler, checked by the fake worker's KV contents."""
import functools
import random

import pytest

from fake_worker import (content_sample_fn, make_prompt, make_request, make_scheduler, run_to_completion, step,
                         tokens_of)
from invariants import free_block_ids
from tinyvllm.scheduler.kv_cache_manager import KVCacheManager
from tinyvllm.scheduler import scheduler as scheduler_module

PREFIX = make_prompt("shared system prompt", 1000)


def greedy(req_id: str, prompt: list[int], max_tokens: int = 8):
    return make_request(req_id, 0, max_tokens=max_tokens, prompt=prompt, temperature=0.0)


def cached_prefix_len(sched, prompt: list[int]) -> int:
    probe = make_request("probe", 0, prompt=prompt + [1])
    return len(sched.kv_cache_manager.find_cached_prefix(probe)) * sched.config.block_size


def run_two_requests_sharing_a_prefix(caching: bool):
    sched, worker = make_scheduler(block_size=8, num_blocks=512, max_model_len=2048, max_num_batched_tokens=512,
                                   enable_prefix_caching=caching, sample_fn=content_sample_fn)
    sched.add_request(greedy("a", PREFIX + make_prompt("a", 20)))
    out_a = run_to_completion(sched, worker)["a"]
    sched.add_request(greedy("b", PREFIX + make_prompt("b", 30)))
    out_b = run_to_completion(sched, worker)["b"]

    decodes = 8 - 1
    assert worker.num_computed_by_req["a"] == 1020 + decodes
    assert worker.num_computed_by_req["b"] == (30 if caching else 1030) + decodes
    assert {o.num_cached_tokens for o in out_a} == {0}
    assert {o.num_cached_tokens for o in out_b} == {1000 if caching else 0}
    stats = sched.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == ((2050, 1000) if caching else (0, 0))
    assert sched.kv_cache_manager.num_free_blocks == 512
    return tokens_of(out_a), tokens_of(out_b)


def test_a_shared_1000_token_prefix_is_computed_once_and_outputs_do_not_change():
    assert run_two_requests_sharing_a_prefix(caching=True) == run_two_requests_sharing_a_prefix(caching=False)


def test_a_request_shares_the_live_blocks_of_a_running_one():
    sched, worker = make_scheduler(block_size=8, num_blocks=512, max_model_len=2048, max_num_batched_tokens=2048)
    a = make_request("a", 0, max_tokens=50, prompt=PREFIX + [5])
    sched.add_request(a)
    step(sched, worker)
    b = make_request("b", 0, max_tokens=5, prompt=PREFIX + [6, 7])
    sched.add_request(b)
    plan, _ = step(sched, worker)
    (new_b,) = plan.new_reqs
    assert (new_b.num_computed_tokens, new_b.num_scheduled_tokens) == (1000, 2)
    assert b.block_ids[:125] == a.block_ids[:125] and b.block_ids[125] != a.block_ids[125]
    assert all(sched.kv_cache_manager.pool.blocks[i].ref_count == 2 for i in a.block_ids[:125])
    run_to_completion(sched, worker)


def test_cached_free_blocks_are_revived_and_evicted_least_recently_used_first():
    # 6 blocks of 4. x and y each leave 2 cached blocks behind.
    sched, worker = make_scheduler(block_size=4, num_blocks=6, max_num_batched_tokens=64)
    x, y = make_prompt("x", 8), make_prompt("y", 8)
    for req_id, prompt in [("x", x), ("y", y)]:
        sched.add_request(make_request(req_id, 0, max_tokens=1, prompt=prompt))
        run_to_completion(sched, worker)
    assert cached_prefix_len(sched, x) == 8 and cached_prefix_len(sched, y) == 8
    assert sched.kv_cache_manager.num_free_blocks == 6

    # A hit on x revives its blocks (out of the free queue) and makes them the most recently used.
    x_again = make_request("x2", 0, max_tokens=1, prompt=x + [3])
    sched.add_request(x_again)
    plan, _ = step(sched, worker)
    assert plan.new_reqs[0].num_computed_tokens == 8 and not sched.has_unfinished()
    # Free queue: the never-used block, y's tail and head, x2's partial block, x's tail and head (x: 0, 1; y: 2, 3).
    assert free_block_ids(sched.kv_cache_manager.pool) == [5, 3, 2, 4, 1, 0]
    sched.add_request(make_request("z", 8, max_tokens=1))
    run_to_completion(sched, worker)
    # z took the never-used block, then y's tail (y was used less recently than x): y keeps its head only.
    assert cached_prefix_len(sched, x) == 8 and cached_prefix_len(sched, y) == 4
    sched.add_request(make_request("w", 8, max_tokens=1))
    run_to_completion(sched, worker)
    # w took y's head, then x2's uncached block: x is still whole.
    assert cached_prefix_len(sched, y) == 0 and cached_prefix_len(sched, x) == 8


def test_a_hash_collision_is_never_served():
    specs = [(f"r{i}", PREFIX[:40 * (i % 3)] + make_prompt(f"r{i}", 5 + i)) for i in range(12)]

    def run(hash_fn):
        with pytest.MonkeyPatch.context() as patch:
            if hash_fn is not None:  # the scheduler's one block manager, which its KV tiers share, hashes with it
                patch.setattr(scheduler_module, "KVCacheManager", functools.partial(KVCacheManager, hash_fn=hash_fn))
            sched, worker = make_scheduler(block_size=4, num_blocks=200, max_model_len=256, max_num_seqs=3,
                                           sample_fn=content_sample_fn)
        for req_id, prompt in specs:
            sched.add_request(greedy(req_id, prompt))
        outputs = run_to_completion(sched, worker)
        return {req_id: tokens_of(outputs[req_id]) for req_id, _ in specs}, sched.stats().prefix_cache_hits

    expected, hits = run(None)
    collided, collided_hits = run(lambda parent, tokens: bytes([sum(tokens) % 3]))  # three hashes for everything
    assert collided == expected and hits > 0 and collided_hits < hits


def test_a_preempted_request_resumes_through_the_cache():
    # 9 blocks of 4: a and b prefill 16 tokens each (8 blocks); a takes the last block for its first decode,
    # b finds none and is preempted; its 4 full blocks stay cached until a finishes and b comes back.
    sched, worker = make_scheduler(block_size=4, num_blocks=9, max_num_batched_tokens=64)
    a, b = make_request("a", 16, max_tokens=3), make_request("b", 16, max_tokens=3)
    sched.add_request(a)
    sched.add_request(b)
    step(sched, worker)
    plan, _ = step(sched, worker)
    assert plan.finished_req_ids == ["b"] and b.num_preemptions == 1 and sched.stats().num_preemptions == 1
    resumed = None
    while sched.has_unfinished():
        plan, _ = step(sched, worker)
        resumed = resumed or next((r for r in plan.new_reqs if r.req_id == "b"), None)
    assert (resumed.num_computed_tokens, resumed.num_scheduled_tokens) == (16, 1)
    assert worker.num_computed_by_req["b"] == 16 + 1 + 1  # prompt once, position 16 twice, position 17
    assert len(b.output_token_ids) == 3
    stats = sched.stats()
    assert stats.prefix_cache_queries == 16 + 16 + 17 and stats.prefix_cache_hits == 16


def shared_prefix_workload(seed: int, n: int):
    rng = random.Random(seed)
    prefixes = [make_prompt(f"prefix{i}", rng.randint(4, 40)) for i in range(3)]
    return [(f"r{i}", rng.choice(prefixes)[:rng.randint(0, 40)] + make_prompt(f"r{i}", rng.randint(1, 12)),
             rng.randint(1, 20)) for i in range(n)]


def run_shared(specs, **config):
    sched, worker = make_scheduler(sample_fn=content_sample_fn, **config)
    for req_id, prompt, max_tokens in specs:
        assert sched.add_request(greedy(req_id, prompt, max_tokens))
    outputs = run_to_completion(sched, worker)
    kv = sched.kv_cache_manager
    assert kv.num_free_blocks == kv.num_total_blocks and all(b.ref_count == 0 for b in kv.pool.blocks)
    return {req_id: tokens_of(outputs[req_id]) for req_id, _, _ in specs}, sched.stats()


@pytest.mark.parametrize("seed", range(3))
def test_pressure_gives_the_same_outputs_as_an_unpressured_run(seed):
    specs = shared_prefix_workload(seed, n=30)
    # max_model_len 56 < 14 blocks * 4 + 1: the pool never caps a request's length, so only pressure differs.
    expected, _ = run_shared(specs, max_num_seqs=32, num_blocks=2048, block_size=4, max_model_len=56,
                             enable_prefix_caching=False)
    preemptions = hits = 0
    for num_blocks, budget in [(14, 64), (16, 7), (20, 3)]:
        got, stats = run_shared(specs, max_num_seqs=8, num_blocks=num_blocks, block_size=4, max_model_len=56,
                                max_num_batched_tokens=budget)
        assert got == expected
        preemptions, hits = preemptions + stats.num_preemptions, hits + stats.prefix_cache_hits
    assert preemptions > 0 and hits > 0
