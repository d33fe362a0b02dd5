"""Several steps in flight (vLLM V1's batch queue): schedule() plans only requests in no outstanding step, results
are taken in plan order, a request in flight is never preempted, and an abort in flight frees its blocks at once."""
import pytest

from fake_worker import make_request, make_scheduler, run_to_completion, tokens_of
from in_flight_driver import InFlightDriver, scheduled_ids
from invariants import check_scheduler_invariants
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.scheduler.config import SchedulerConfig
from tinyvllm.scheduler.request import RequestStatus


def test_at_least_one_step_in_flight():
    with pytest.raises(ValueError, match="max_steps_in_flight"):
        SchedulerConfig(8, 64, 128, 4, 64, max_steps_in_flight=0)


def test_a_request_is_never_in_two_outstanding_steps():
    sched, worker = make_scheduler(max_steps_in_flight=3)
    sched.add_request(make_request("a", 5))
    first = sched.schedule()
    assert scheduled_ids(first) == {"a"}
    assert sched.schedule() is None  # a's token is not back yet: nothing else to plan
    sched.add_request(make_request("b", 5))
    second = sched.schedule()
    assert scheduled_ids(second) == {"b"} and second.step_id == first.step_id + 1
    assert sched.schedule() is None
    check_scheduler_invariants(sched)
    assert [o.req_id for o in sched.update_from_output(first, worker.execute(first))] == ["a"]
    third = sched.schedule()  # a is back (the plan brings its token to the workers); b is still in flight
    assert scheduled_ids(third) == {"a"} and third.cached_reqs[0].new_token_ids == sched.requests["a"].output_token_ids
    sched.add_request(make_request("c", 5))
    assert scheduled_ids(sched.schedule()) == {"c"}
    with pytest.raises(RuntimeError, match="3 steps are in flight"):
        sched.schedule()
    check_scheduler_invariants(sched)


def test_two_steps_in_flight_plan_the_second_group_while_the_first_runs():
    results = {}
    for steps_in_flight in (1, 2):
        sched, worker = make_scheduler(max_steps_in_flight=steps_in_flight)
        driver = InFlightDriver(sched, worker)
        for name in ("a", "b"):
            sched.add_request(make_request(name, 6, max_tokens=8))
        driver.fill()  # with room for two steps there is nothing for the second yet: a and b are in the first
        for name in ("c", "d"):
            sched.add_request(make_request(name, 6, max_tokens=8))
        results[steps_in_flight] = driver.run_to_completion()
        plans = worker.num_reqs_per_step
        if steps_in_flight == 2:
            assert driver.max_outstanding == 2 and plans == [2] * 16  # the groups take turns, one step each
        else:
            assert driver.max_outstanding == 1 and plans == [2] + [4] * 7 + [2]
    assert {k: tokens_of(v) for k, v in results[1].items()} == {k: tokens_of(v) for k, v in results[2].items()}


def test_results_must_come_in_plan_order():
    sched, worker = make_scheduler(max_steps_in_flight=2)
    sched.add_request(make_request("a", 5))
    first = sched.schedule()
    sched.add_request(make_request("b", 5))
    second = sched.schedule()
    first_result, second_result = worker.execute(first), worker.execute(second)
    with pytest.raises(ValueError, match="not the oldest step in flight"):
        sched.update_from_output(second, second_result)
    check_scheduler_invariants(sched)  # the refused result changed nothing
    assert [o.req_id for o in sched.update_from_output(first, first_result)] == ["a"]
    assert [o.req_id for o in sched.update_from_output(second, second_result)] == ["b"]
    with pytest.raises(ValueError):
        sched.update_from_output(second, second_result)


def test_preemption_never_picks_a_request_in_flight():
    # 4 blocks of 4: a and b take two each for their 8-token prompts; a's first decode needs a fifth.
    sched, worker = make_scheduler(block_size=4, num_blocks=4, max_steps_in_flight=2, enable_prefix_caching=False)
    a, b = make_request("a", 8, max_tokens=4), make_request("b", 8, max_tokens=4)
    sched.add_request(a)
    first = sched.schedule()
    sched.add_request(b)
    second = sched.schedule()
    sched.update_from_output(first, worker.execute(first))
    assert sched.kv_cache_manager.num_free_blocks == 0
    assert sched.schedule() is None  # only b, in flight, could make room: a waits, keeping its blocks
    assert b.num_preemptions == 0 and a.status is RequestStatus.RUNNING and len(a.block_ids) == 2
    check_scheduler_invariants(sched)
    sched.update_from_output(second, worker.execute(second))
    third = sched.schedule()  # b is back: now it gives way to the older a
    assert scheduled_ids(third) == {"a"} and third.finished_req_ids == ["b"] and b.num_preemptions == 1
    sched.update_from_output(third, worker.execute(third))
    outputs = InFlightDriver(sched, worker).run_to_completion()
    assert len(tokens_of(outputs["a"])) == 2 and len(tokens_of(outputs["b"])) == 3  # plus one each before


def test_the_newest_request_preempts_itself_while_an_older_one_is_in_flight():
    sched, worker = make_scheduler(block_size=4, num_blocks=4, max_steps_in_flight=2, enable_prefix_caching=False)
    old, new = make_request("old", 5, max_tokens=3), make_request("new", 8, max_tokens=3)
    sched.add_request(old)
    first = sched.schedule()
    sched.add_request(new)
    second = sched.schedule()  # the pool is full: old's 5 tokens have room for 8, new's 8 for no more
    sched.update_from_output(first, worker.execute(first))
    third = sched.schedule()
    assert scheduled_ids(third) == {"old"}
    sched.update_from_output(second, worker.execute(second))
    assert sched.schedule() is None  # new needs a block; only old (in flight, older) holds any: new gives way
    assert new.num_preemptions == 1 and old.num_preemptions == 0 and sched.waiting[0] is new
    check_scheduler_invariants(sched)
    sched.update_from_output(third, worker.execute(third))
    outputs = InFlightDriver(sched, worker).run_to_completion()
    assert len(tokens_of(outputs["old"])) == 1 and len(tokens_of(outputs["new"])) == 2  # plus one each before


def test_an_abort_in_flight_frees_its_blocks_at_once_and_its_late_result_is_ignored():
    sched, worker = make_scheduler(block_size=4, num_blocks=4, max_steps_in_flight=2, enable_prefix_caching=False)
    sched.add_request(make_request("a", 8, max_tokens=4))
    first = sched.schedule()
    a_blocks = list(sched.requests["a"].block_ids)
    sched.abort(["a"])
    assert sched.kv_cache_manager.num_free_blocks == 4
    assert [(o.req_id, o.finish_reason) for o in sched.take_pending_outputs()] == [("a", FinishReason.ABORT)]
    check_scheduler_invariants(sched)
    sched.add_request(make_request("c", 15, max_tokens=3))
    second = sched.schedule()  # the workers compute it after the first step, so c may take a's blocks
    assert second.finished_req_ids == ["a"] and set(a_blocks) < set(second.new_reqs[0].block_ids)
    assert sched.update_from_output(first, worker.execute(first)) == []  # a's token comes back too late
    check_scheduler_invariants(sched)
    (out,) = sched.update_from_output(second, worker.execute(second))
    assert out.req_id == "c" and "a" not in sched.requests
    outputs = run_to_completion(sched, worker)
    assert len(tokens_of(outputs["c"])) == 1 and sched.kv_cache_manager.num_free_blocks == 4  # 17 tokens: the pool
