"""n > 1: children fork off the leader's prompt blocks, copy-on-write separates them, outputs keep the parent id."""
import pytest

from fake_worker import by_index, content_sample_fn, make_request, make_scheduler, run_to_completion, step, tokens_of
from invariants import check_scheduler_invariants
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.scheduler.parallel_sampling import child_seed


def parallel_scheduler(**config):
    return make_scheduler(**{"block_size": 4, "num_blocks": 64, "sample_fn": content_sample_fn, **config})


def run_parent(req, **config) -> dict[int, list]:
    sched, worker = parallel_scheduler(**config)
    assert sched.add_request(req)
    outputs = run_to_completion(sched, worker)
    assert set(outputs) == {req.req_id} and sched.kv_cache_manager.num_free_blocks == 64
    return by_index(outputs[req.req_id])


def test_the_prompt_is_prefilled_once_and_its_full_blocks_stored_once():
    sched, worker = parallel_scheduler()
    sched.add_request(make_request("p", 18, max_tokens=5, n=4, seed=7, temperature=1.0))
    assert sched.num_waiting == 4 and sched.num_running == 0
    plan, outs = step(sched, worker)  # the leader computes all but the last prompt token
    assert [(r.req_id, r.num_scheduled_tokens) for r in plan.new_reqs] == [("p#0", 17)] and outs == {}
    children = [sched.requests[f"p#{i}"] for i in range(4)]
    assert all(child.block_ids == children[0].block_ids for child in children) and sched.num_running == 4
    assert len(set(children[0].block_ids)) == 5  # four full blocks and the one position 16 went into

    plan, outs = step(sched, worker)
    leader_blocks = children[0].block_ids
    assert len({b for child in children for b in child.block_ids[:4]}) == 4  # full blocks: stored once
    assert len({child.block_ids[4] for child in children}) == 4  # the block each child writes: its own
    assert plan.block_copies == [[leader_blocks[4], child.block_ids[4]] for child in children[1:]]
    assert plan.cached_reqs[0].req_id == "p#0" and plan.cached_reqs[0].new_block_ids == []  # in place
    assert [(r.req_id, r.num_computed_tokens, r.num_scheduled_tokens) for r in plan.new_reqs] == [
        (f"p#{i}", 17, 1) for i in range(1, 4)]
    assert [r.sampling.seed for r in plan.new_reqs] == [8, 9, 10] and {r.sampling.n for r in plan.new_reqs} == {1}
    assert set(outs) == {"p"} and worker.num_block_copies == 3
    assert worker.num_computed_by_req["p#0"] == 18 and worker.num_computed_by_req["p#1"] == 1
    run_to_completion(sched, worker)


def test_seeded_children_differ_and_are_reproducible():
    req = lambda: make_request("p", 10, max_tokens=6, n=4, seed=123, temperature=0.8)
    first, second = run_parent(req()), run_parent(req())
    assert sorted(first) == [0, 1, 2, 3]
    tokens = {i: tokens_of(outs) for i, outs in first.items()}
    assert tokens == {i: tokens_of(outs) for i, outs in second.items()}
    assert len({tuple(t) for t in tokens.values()}) == 4
    for outs in first.values():  # one finish_reason per child, on its last output
        assert [o.finish_reason for o in outs] == [None] * 5 + [FinishReason.LENGTH]
    alone = run_parent(make_request("p", 10, max_tokens=6, seed=123, temperature=0.8))
    assert tokens_of(alone[0]) == tokens[0]  # child 0 keeps the parent's seed


def test_child_seeds_are_distinct_and_wrap_into_int64():
    assert [child_seed(5, i) for i in range(3)] == [5, 6, 7] and child_seed(None, 2) is None
    assert child_seed(2**63 - 1, 1) == -(2**63)


def test_greedy_children_agree_and_unseeded_ones_get_no_seed():
    outputs = run_parent(make_request("p", 9, max_tokens=4, n=3, temperature=0.0))
    assert len({tuple(tokens_of(outs)) for outs in outputs.values()}) == 1
    sched, worker = parallel_scheduler()
    sched.add_request(make_request("q", 9, max_tokens=2, n=2, temperature=1.0))
    step(sched, worker)
    plan, _ = step(sched, worker)
    assert [r.sampling.seed for r in plan.new_reqs] == [None] and sched.requests["q#0"].sampling.seed is None


@pytest.mark.parametrize("prompt_len", [1, 2, 4, 5, 8, 9])
def test_every_prompt_length_forks_correctly(prompt_len):
    outputs = run_parent(make_request("p", prompt_len, max_tokens=7, n=3, seed=1, temperature=1.0))
    assert sorted(outputs) == [0, 1, 2] and all(len(tokens_of(o)) == 7 for o in outputs.values())


def test_more_children_than_seats_wait_and_still_finish():
    sched, worker = parallel_scheduler(max_num_seqs=2, num_blocks=64)
    sched.add_request(make_request("p", 10, max_tokens=5, n=5, seed=3, temperature=1.0))
    sched.add_request(make_request("other", 6, max_tokens=5))
    assert sched.num_waiting == 6
    plan, _ = step(sched, worker)  # two seats: the leader and one reserved sibling; "other" may not overtake
    assert [r.req_id for r in plan.new_reqs] == ["p#0"]
    assert sched.num_running == 2 and [r.req_id for r in sched.waiting] == ["p#2", "p#3", "p#4", "other"]
    outputs = run_to_completion(sched, worker)
    assert sorted(by_index(outputs["p"])) == [0, 1, 2, 3, 4]
    assert all(len(tokens_of(o)) == 5 for o in by_index(outputs["p"]).values())
    assert worker.num_computed_by_req["p#2"] == 2 + 4  # found the prompt's full blocks in the cache


def test_a_cache_hit_up_to_the_fork_point_lets_each_child_look_the_prompt_up():
    sched, worker = parallel_scheduler()
    prompt = make_request("x", 9).prompt_token_ids
    sched.add_request(make_request("first", 0, max_tokens=1, prompt=prompt))
    run_to_completion(sched, worker)
    sched.add_request(make_request("p", 0, max_tokens=3, prompt=prompt, n=3, seed=0, temperature=1.0))
    plan, _ = step(sched, worker)
    assert [(r.req_id, r.num_computed_tokens, r.num_scheduled_tokens) for r in plan.new_reqs] == [
        ("p#0", 8, 1), ("p#1", 8, 1), ("p#2", 8, 1)]
    outputs = run_to_completion(sched, worker)
    assert {o.num_cached_tokens for o in outputs["p"]} == {8}


def test_children_report_the_leaders_cached_tokens():
    sched, worker = parallel_scheduler()
    prompt = make_request("x", 13).prompt_token_ids
    sched.add_request(make_request("first", 0, max_tokens=1, prompt=prompt[:8] + [1]))
    run_to_completion(sched, worker)
    sched.add_request(make_request("p", 0, max_tokens=2, prompt=prompt, n=2, seed=0, temperature=1.0))
    outputs = run_to_completion(sched, worker)
    assert {(o.index, o.num_cached_tokens) for o in outputs["p"]} == {(0, 8), (1, 8)}
    assert worker.num_computed_by_req["p#0"] == 13 - 8 + 1


@pytest.mark.parametrize("when", ["waiting", "prefilling", "forked", "in_flight"])
def test_aborting_the_parent_aborts_every_child(when):
    sched, worker = parallel_scheduler(max_num_batched_tokens=8)
    sched.add_request(make_request("p", 20, max_tokens=9, n=3, seed=2, temperature=1.0))
    for _ in range({"waiting": 0, "prefilling": 1, "forked": 4, "in_flight": 4}[when]):
        step(sched, worker)
    plan = sched.schedule() if when == "in_flight" else None
    sched.abort(["p"])
    if plan is not None:
        sched.update_from_output(plan, worker.execute(plan))
    aborts = sched.take_pending_outputs()
    assert [(o.req_id, o.index, o.finish_reason) for o in aborts] == [("p", i, FinishReason.ABORT) for i in range(3)]
    assert not sched.has_unfinished() and not sched.groups and sched.kv_cache_manager.num_free_blocks == 64
    check_scheduler_invariants(sched)
    run_to_completion(sched, worker)


def test_a_finished_child_is_not_aborted_again():
    sched, worker = parallel_scheduler()
    sched.add_request(make_request("p", 5, max_tokens=4, n=2, seed=0, temperature=1.0))
    sched.requests["p#1"].sampling.max_tokens = 1
    while "p#1" in sched.requests:
        step(sched, worker)
    sched.abort(["p"])
    assert [(o.index, o.finish_reason) for o in sched.take_pending_outputs()] == [(0, FinishReason.ABORT)]


def test_rejection_is_one_error_output_under_the_parent_id():
    sched, _ = parallel_scheduler(max_model_len=16)
    assert not sched.add_request(make_request("p", 20, n=4))
    assert not sched.add_request(make_request("q", 5, n=0))
    outs = sched.take_pending_outputs()
    assert [(o.req_id, o.index, o.finish_reason) for o in outs] == [("p", 0, FinishReason.ERROR), ("q", 0, FinishReason.ERROR)]
    assert "max_model_len" in outs[0].error and "n must be" in outs[1].error


def test_ids_of_parents_and_children_cannot_collide():
    sched, _ = parallel_scheduler()
    assert sched.add_request(make_request("p", 5, n=2))
    for clash in [make_request("p", 5), make_request("p#1", 5), make_request("p", 5, n=3)]:
        assert not sched.add_request(clash)
    assert sched.add_request(make_request("x#0", 5))
    assert not sched.add_request(make_request("x", 5, n=2))
    assert all("in use" in o.error for o in sched.take_pending_outputs())
