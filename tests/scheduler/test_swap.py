"""CPU swap (scheduler/swap.py) with the fake worker, whose KV checks fail on any block swapped back wrong."""
import pytest

from fake_worker import make_request, make_scheduler, run_to_completion, step, tokens_of
from invariants import check_scheduler_invariants, check_swap_space
from tinyvllm.scheduler.kv_cache_manager import KVCacheManager
from tinyvllm.scheduler.swap import SwapSpace


def three_requests_in_six_blocks(**config):
    """Three prefills of 8 tokens fill 6 blocks of 4; the next step preempts the newest, c."""
    sched, worker = make_scheduler(block_size=4, num_blocks=6, enable_prefix_caching=False, **config)
    reqs = [make_request(name, 8, max_tokens=4) for name in "abc"]
    for req in reqs:
        sched.add_request(req)
    step(sched, worker)
    return sched, worker, reqs


def unpressured_outputs(names="abc"):
    sched, worker = make_scheduler(block_size=4, num_blocks=64)
    reqs = [make_request(name, 8, max_tokens=4) for name in names]
    for req in reqs:
        sched.add_request(req)
    outputs = run_to_completion(sched, worker)
    return {name: tokens_of(outputs[name]) for name in names}


def test_a_swapped_request_resumes_where_it_was_with_no_recompute():
    sched, worker, (a, b, c) = three_requests_in_six_blocks(num_swap_slots=8)
    plan, _ = step(sched, worker)
    assert plan.finished_req_ids == ["c"] and plan.swap_out == [[block, slot] for block, slot in zip([4, 5], [0, 1])]
    assert c.num_computed_tokens == 8 and c.swap_slots == [0, 1] and sched.stats().num_free_swap_slots == 6
    resumed = []
    while sched.has_unfinished():
        plan, _ = step(sched, worker)
        resumed += [(r, plan.swap_in) for r in plan.new_reqs if r.req_id == "c"]
    ((c_new, swap_in),) = resumed
    assert c_new.num_computed_tokens == 8 and c_new.num_scheduled_tokens == 1  # only its sampled token
    assert [slot for slot, _ in swap_in] == [0, 1] and [block for _, block in swap_in] == c_new.block_ids[:2]
    total = {name: 8 + 4 - 1 for name in "abc"}  # every prompt and output token once, but the last output
    assert dict(worker.num_computed_by_req) == total and sched.stats().num_tokens_computed == sum(total.values())
    stats = sched.stats()
    assert stats.num_swapped_out_blocks == stats.num_swapped_in_blocks == worker.host_swap.num_swapped_in_blocks == 2
    assert stats.num_free_swap_slots == stats.num_swap_slots == 8 and stats.swap_usage == 0.0
    assert {r.req_id: r.output_token_ids for r in (a, b, c)} == unpressured_outputs()


@pytest.mark.parametrize("config, why", [(dict(num_swap_slots=0), "no swap space"),
                                         (dict(num_swap_slots=1), "2 blocks do not fit 1 slot"),
                                         (dict(num_swap_slots=8, swap_min_tokens=9), "8 computed tokens: too few")])
def test_recompute_when_swap_is_off_full_or_not_worth_it(config, why):
    sched, worker, (a, b, c) = three_requests_in_six_blocks(**config)
    plan, _ = step(sched, worker)
    assert plan.finished_req_ids == ["c"] and plan.swap_out == [], why
    assert c.num_computed_tokens == 0 and c.swap_slots == []
    run_to_completion(sched, worker)
    assert worker.num_computed_by_req["c"] > 8 + 4 - 1 and worker.host_swap.num_swapped_out_blocks == 0
    assert {r.req_id: r.output_token_ids for r in (a, b, c)} == unpressured_outputs()


def test_swap_space_full_falls_back_to_recompute_for_the_next_victim():
    sched, worker = make_scheduler(block_size=4, num_blocks=8, enable_prefix_caching=False, num_swap_slots=2)
    reqs = [make_request(name, 8, max_tokens=4) for name in "abcd"]
    for req in reqs:
        sched.add_request(req)
    step(sched, worker)  # 8 blocks taken; a and b need a third block each: d, then c give way
    plan, _ = step(sched, worker)
    assert plan.finished_req_ids == ["d", "c"] and plan.swap_out == [[6, 0], [7, 1]]
    assert reqs[3].swap_slots == [0, 1] and reqs[2].swap_slots == [] and reqs[2].num_computed_tokens == 0
    run_to_completion(sched, worker)
    assert worker.num_computed_by_req["d"] == 11 and worker.num_computed_by_req["c"] > 11
    assert {r.req_id: r.output_token_ids for r in reqs} == unpressured_outputs("abcd")


def test_aborting_a_swapped_request_frees_its_slots():
    sched, worker, (a, b, c) = three_requests_in_six_blocks(num_swap_slots=2)
    step(sched, worker)
    assert c.swap_slots and sched.stats().num_free_swap_slots == 0
    sched.abort(["c"])
    assert c.swap_slots == [] and sched.stats().num_free_swap_slots == 2
    (out,) = sched.take_pending_outputs()
    assert out.req_id == "c" and out.finish_reason == "abort"
    check_scheduler_invariants(sched)
    run_to_completion(sched, worker)
    assert sched.stats().num_free_swap_slots == 2


def test_a_swap_in_slot_is_not_reused_by_a_swap_out_of_the_same_plan():
    # workers swap out before they swap in: a slot read by a plan's swap-in must not be written by its swap-outs
    swap, kv = SwapSpace(num_slots=2, min_tokens=1), KVCacheManager(num_blocks=8, block_size=4)
    c, d = make_request("c", 8), make_request("d", 8)
    for req in (c, d):
        req.num_computed_tokens = 8
        assert kv.admit(req, [], 8)
    swap.swap_out(c, kv)
    kv.free(c)
    assert swap.take_plan_lists() == ([[0, 0], [1, 1]], []) and not swap.should_swap(d, kv)
    assert kv.admit(c, [], 9)
    swap.swap_in(c)
    assert not swap.should_swap(d, kv)  # c's slots are free only once this plan is made
    assert swap.take_plan_lists() == ([], [[0, c.block_ids[0]], [1, c.block_ids[1]]]) and swap.should_swap(d, kv)
    check_swap_space(swap, [c, d])
