from fake_worker import make_request, make_scheduler, run_to_completion, step, tokens_of
from invariants import check_scheduler_invariants
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.scheduler.request import RequestStatus


def abort_outputs(sched):
    return [(o.req_id, o.finish_reason, o.new_token_ids) for o in sched.take_pending_outputs()]


def test_abort_waiting_request():
    sched, worker = make_scheduler(max_num_seqs=1)
    sched.add_request(make_request("a", 5, max_tokens=3))
    b = make_request("b", 5)
    sched.add_request(b)
    step(sched, worker)
    sched.abort(["b"])
    assert abort_outputs(sched) == [("b", FinishReason.ABORT, [])]
    assert b.status is RequestStatus.FINISHED and b.finish_reason == FinishReason.ABORT and sched.num_waiting == 0
    plan, _ = step(sched, worker)
    assert plan.finished_req_ids == []  # the worker never saw b
    run_to_completion(sched, worker)


def test_abort_running_request_frees_blocks_at_once():
    sched, worker = make_scheduler(num_blocks=16)
    a = make_request("a", 9, max_tokens=10)
    sched.add_request(a)
    sched.add_request(make_request("b", 5, max_tokens=10))
    step(sched, worker)
    sched.abort(["a"])
    assert a.block_ids == [] and sched.kv_cache_manager.num_free_blocks == 16 - 2 and sched.num_running == 1
    check_scheduler_invariants(sched)
    plan, _ = step(sched, worker)
    assert plan.finished_req_ids == ["a"] and "a" not in worker.reqs
    assert abort_outputs(sched) == [("a", FinishReason.ABORT, [])]


def test_abort_mid_chunked_prefill():
    sched, worker = make_scheduler(max_num_batched_tokens=8)
    sched.add_request(make_request("a", 30))
    step(sched, worker)
    sched.abort(["a"])
    assert sched.kv_cache_manager.num_free_blocks == 64 and sched.schedule() is None


def test_abort_while_the_step_is_in_flight():
    sched, worker = make_scheduler(num_blocks=16)
    sched.add_request(make_request("a", 5, max_tokens=10))
    sched.add_request(make_request("b", 5, max_tokens=10))
    step(sched, worker)
    plan = sched.schedule()
    result = worker.execute(plan)
    sched.abort(["a"])
    check_scheduler_invariants(sched)
    outs = sched.update_from_output(plan, result)  # a's token arrives after its abort: dropped
    assert [o.req_id for o in outs] == ["b"]
    check_scheduler_invariants(sched)
    assert abort_outputs(sched) == [("a", FinishReason.ABORT, [])]
    outputs = run_to_completion(sched, worker)
    assert "a" not in outputs and len(tokens_of(outs) + tokens_of(outputs["b"])) == 9
    assert sched.kv_cache_manager.num_free_blocks == 16


def test_abort_during_the_step_that_finishes_the_request():
    sched, worker = make_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=1))
    plan = sched.schedule()
    sched.abort(["a"])
    assert sched.update_from_output(plan, worker.execute(plan)) == []
    assert abort_outputs(sched) == [("a", FinishReason.ABORT, [])]
    check_scheduler_invariants(sched)


def test_unknown_finished_and_repeated_aborts_are_ignored():
    sched, worker = make_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=1))
    step(sched, worker)  # a finished
    sched.add_request(make_request("b", 5))
    sched.abort(["nope", "a", "b", "b"])
    sched.abort(["b"])
    assert abort_outputs(sched) == [("b", FinishReason.ABORT, [])]
    check_scheduler_invariants(sched)
