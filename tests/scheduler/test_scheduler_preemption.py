import random

import pytest

from fake_worker import make_request, make_scheduler, run_to_completion, step, tokens_of


def test_newest_request_is_preempted_and_resumed_with_its_outputs():
    sched, worker = make_scheduler(block_size=4, num_blocks=6, enable_prefix_caching=False)
    reqs = [make_request(name, 8, max_tokens=4) for name in "abc"]
    for req in reqs:
        sched.add_request(req)
    step(sched, worker)  # three prefills fill the pool; each now needs a third block
    plan, outs = step(sched, worker)
    assert plan.finished_req_ids == ["c"] and [r.req_id for r in plan.cached_reqs] == ["a", "b"]
    assert set(outs) == {"a", "b"} and reqs[2].num_preemptions == 1 and sched.waiting[0] is reqs[2]
    assert reqs[2].block_ids == [] and reqs[2].num_computed_tokens == 0
    resumed = []
    while sched.has_unfinished():
        plan, _ = step(sched, worker)
        resumed += [r for r in plan.new_reqs if r.req_id == "c"]
    (c,) = resumed
    assert c.prompt_token_ids == reqs[2].prompt_token_ids + reqs[2].output_token_ids[:1]
    assert c.num_scheduled_tokens == 9 and c.num_computed_tokens == 0
    assert sched.stats().num_preemptions == 1


def test_a_request_preempts_itself_when_it_is_the_newest():
    sched, worker = make_scheduler(block_size=4, num_blocks=5)
    a, b = make_request("a", 8, max_tokens=8), make_request("b", 8, max_tokens=8)
    sched.add_request(a)
    sched.add_request(b)
    step(sched, worker)  # 4 of 5 blocks used
    plan, _ = step(sched, worker)  # a takes the last block; b finds none and is the newest
    assert [r.req_id for r in plan.cached_reqs] == ["a"] and plan.finished_req_ids == ["b"]
    assert b.num_preemptions == 1 and a.num_preemptions == 0
    run_to_completion(sched, worker)


def test_nothing_is_admitted_in_a_step_that_preempted():
    # b preempts itself in step 4 and frees 4 blocks, enough for its next 7-token chunk: it must still wait.
    # (With prefix caching, b's resume would revive its 3 cached blocks and need 4 free: it would wait anyway.)
    sched, worker = make_scheduler(block_size=4, num_blocks=6, max_num_batched_tokens=8, enable_prefix_caching=False)
    sched.add_request(make_request("a", 4, max_tokens=20))
    sched.add_request(make_request("b", 16, max_tokens=20))
    for _ in range(3):
        step(sched, worker)
    plan, _ = step(sched, worker)
    assert plan.finished_req_ids == ["b"] and plan.new_reqs == [] and sched.num_waiting == 1
    plan, _ = step(sched, worker)
    assert [r.req_id for r in plan.new_reqs] == ["b"]
    run_to_completion(sched, worker)


def workload(seed: int, n: int):
    rng = random.Random(seed)
    return [(f"r{i}", rng.randint(1, 20), rng.randint(1, 20)) for i in range(n)]


def run_workload(specs, **config):
    sched, worker = make_scheduler(**config)
    reqs = [make_request(req_id, prompt_len, max_tokens=max_tokens) for req_id, prompt_len, max_tokens in specs]
    for req in reqs:
        assert sched.add_request(req)
    outputs = run_to_completion(sched, worker)
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_total_blocks
    return {r.req_id: (tokens_of(outputs[r.req_id]), outputs[r.req_id][-1].finish_reason) for r in reqs}, reqs


@pytest.mark.parametrize("caching", [False, True])
def test_tiny_pool_gives_the_same_outputs_as_an_unpressured_run(caching):
    specs = workload(seed=1, n=30)
    expected, _ = run_workload(specs, max_num_seqs=32, num_blocks=1024, block_size=4)
    for num_blocks, budget in [(10, 64), (12, 7), (12, 3)]:
        got, reqs = run_workload(specs, max_num_seqs=8, num_blocks=num_blocks, block_size=4,
                                 max_num_batched_tokens=budget, enable_prefix_caching=caching)
        assert got == expected
        assert sum(r.num_preemptions for r in reqs) > 0
