"""Disaggregated prefill/decode in the scheduler (scheduler/remote_kv.py), with fake workers: a prefill scheduler
leases a finished prompt's blocks, a decode scheduler pulls them (the fake decode worker copies the fake prefill
worker's KV slots, which record each position's token history) and computes only the last prompt token."""
from fake_worker import make_request, make_scheduler, run_to_completion, step, tokens_of
from invariants import check_scheduler_invariants
from tinyvllm.protocol.messages import ErrorKind, FinishReason, KVTransferParams
from tinyvllm.scheduler.remote_kv import KVLeases
from tinyvllm.scheduler.request import RequestStatus

SIDE = KVTransferParams(remote_engine_id="engine-p", remote_host="127.0.0.1", remote_port=5600, tp_size=1)


def prefill_scheduler(**kw):
    sched, worker = make_scheduler(**kw)
    sched.remote_kv.side_channel = SIDE
    return sched, worker


def decode_scheduler(**kw):
    sched, worker = make_scheduler(**kw)
    sched.remote_kv.takes_remote_prefill = True
    return sched, worker


def prefill(sched, worker, req_id="p", prompt_len=10):
    req = make_request(req_id, prompt_len, max_tokens=1)
    req.kv_transfer = KVTransferParams(do_remote_decode=True)
    sched.add_request(req)
    outputs = run_to_completion(sched, worker)
    (out,) = outputs[req_id]
    return req, out


def test_lease_expires_and_releases():
    now = [0.0]
    leases = KVLeases(30.0, world_size=2, clock=lambda: now[0])
    leases.hold("a", [1, 2])
    now[0] = 10.0
    leases.hold("b", [3])
    assert leases.release("a", 0) == [] and leases.release("a", 1) == [1, 2] and "a" not in leases
    assert leases.expire() == {}
    now[0] = 40.0
    assert leases.expire() == {"b": [3]} and len(leases) == 0 and leases.num_expired == 1
    assert leases.release("unknown", 0) == []


def test_prefill_leases_the_prompt_blocks_and_answers_where_they_are():
    sched, worker = prefill_scheduler(num_blocks=16, block_size=4)
    req, out = prefill(sched, worker, prompt_len=10)
    assert out.finish_reason == FinishReason.LENGTH and len(out.new_token_ids) == 1
    kv = out.kv_transfer
    assert kv.do_remote_prefill and not kv.do_remote_decode and kv.remote_request_id == "p"
    assert kv.remote_num_tokens == 9 and len(kv.remote_block_ids) == 3 and kv.remote_port == 5600
    assert sched.kv_cache_manager.num_free_blocks == 16 - 3  # the last token's block went back at once
    check_scheduler_invariants(sched)
    sched.remote_kv.release(["p"], rank=0)
    assert sched.kv_cache_manager.num_free_blocks == 16
    check_scheduler_invariants(sched)


def test_an_unreleased_lease_runs_out():
    sched, worker = prefill_scheduler(num_blocks=16)
    now = [0.0]
    sched.remote_kv.leases.clock = lambda: now[0]
    prefill(sched, worker)
    assert sched.kv_cache_manager.num_free_blocks < 16
    now[0] = 31.0
    assert sched.schedule() is None and sched.kv_cache_manager.num_free_blocks == 16


def test_do_remote_decode_without_a_side_channel_is_refused():
    sched, _ = make_scheduler()
    req = make_request("x", 5, max_tokens=1)
    req.kv_transfer = KVTransferParams(do_remote_decode=True)
    assert not sched.add_request(req)
    (out,) = sched.take_pending_outputs()
    assert out.finish_reason == FinishReason.ERROR and "side channel" in out.error


def test_decode_pulls_the_prompt_and_computes_only_its_last_token():
    p_sched, p_worker = prefill_scheduler(num_blocks=16, block_size=4)
    both_sched, both_worker = make_scheduler(num_blocks=16, block_size=4)
    prompt_len = 10
    _, p_out = prefill(p_sched, p_worker, prompt_len=prompt_len)

    d_sched, d_worker = decode_scheduler(num_blocks=16, block_size=4)
    d_worker.kv_source = p_worker
    req = make_request("p", prompt_len, max_tokens=6)
    req.kv_transfer = p_out.kv_transfer
    d_sched.add_request(req)
    plan, _ = step(d_sched, d_worker)  # the pull alone: no token computed yet
    assert [load.req_id for load in plan.kv_loads] == ["p"] and not plan.new_reqs
    assert req.status is RequestStatus.RUNNING and req.num_computed_tokens == prompt_len - 1
    outputs = run_to_completion(d_sched, d_worker)
    assert d_worker.num_computed_by_req["p"] == 1 + 5  # the last prompt token, then the decodes
    assert outputs["p"][0].num_cached_tokens == prompt_len - 1 and d_sched.remote_kv.num_remote_tokens == 9

    both_sched.add_request(make_request("p", prompt_len, max_tokens=6))
    assert tokens_of(outputs["p"]) == tokens_of(run_to_completion(both_sched, both_worker)["p"])
    assert d_sched.kv_cache_manager.num_free_blocks == 16


def test_a_failed_pull_ends_the_request_with_an_error():
    p_sched, p_worker = prefill_scheduler()
    _, p_out = prefill(p_sched, p_worker)
    d_sched, d_worker = decode_scheduler()  # no kv_source: the fake worker fails the load
    req = make_request("p", 10, max_tokens=4)
    req.kv_transfer = p_out.kv_transfer
    d_sched.add_request(req)
    _, outs = step(d_sched, d_worker)
    assert outs["p"].finish_reason == FinishReason.ERROR and "no prefill worker" in outs["p"].error
    assert outs["p"].error_kind == ErrorKind.ENGINE_FAILURE and not d_sched.has_unfinished()
    assert d_sched.kv_cache_manager.num_free_blocks == 64


def test_abort_while_pulling_and_wrong_shapes():
    p_sched, p_worker = prefill_scheduler()
    _, p_out = prefill(p_sched, p_worker)
    d_sched, d_worker = decode_scheduler()
    d_worker.kv_source = p_worker
    req = make_request("p", 10, max_tokens=4)
    req.kv_transfer = p_out.kv_transfer
    d_sched.add_request(req)
    plan = d_sched.schedule()
    d_sched.abort(["p"])
    check_scheduler_invariants(d_sched)
    assert d_sched.update_from_output(plan, d_worker.execute(plan)) == []
    assert d_sched.kv_cache_manager.num_free_blocks == 64 and not d_sched.has_unfinished()

    other = make_request("q", 7, max_tokens=4)  # not the prompt the remote KV was computed for
    other.kv_transfer = p_out.kv_transfer
    assert not d_sched.add_request(other)
    assert "remote KV holds 9 tokens" in d_sched.take_pending_outputs()[-1].error


def test_workers_serve_only_leased_blocks_until_the_lease_ends():
    """The plan that completes a prompt tells the workers which blocks they may serve under its id; a later plan
    says when that ended (released, expired or never leased), before any step writes those blocks again."""
    sched, worker = prefill_scheduler(num_blocks=16, block_size=4)
    now = [0.0]
    sched.remote_kv.leases.clock = lambda: now[0]
    _, out = prefill(sched, worker, req_id="released")
    assert worker.leases["released"][0] == out.kv_transfer.remote_block_ids
    _, expiring = prefill(sched, worker, req_id="expiring")
    sched.remote_kv.release(["released"], rank=0)
    now[0] = 31.0
    aborted = make_request("aborted", 10, max_tokens=1)
    aborted.kv_transfer = KVTransferParams(do_remote_decode=True)
    sched.add_request(aborted)
    plan = sched.schedule()
    assert plan.kv_leases_ended == ["released", "expiring"] and [lease.req_id for lease in plan.kv_leases] == ["aborted"]
    result = worker.execute(plan)
    sched.abort(["aborted"])
    sched.update_from_output(plan, result)
    assert list(worker.leases) == ["aborted"]
    sched.add_request(make_request("next", 40, max_tokens=2))  # reuses every block: the fake worker checks leases
    run_to_completion(sched, worker)
    assert worker.leases == {} and expiring.kv_transfer.remote_request_id == "expiring"


def test_a_decode_request_that_ends_before_its_pull_gives_the_lease_back():
    """Aborted before any plan carried its load: nobody would pull, so the scheduler releases it (scheduler/main.py);
    aborted after: the worker's pull releases it."""
    p_sched, p_worker = prefill_scheduler()
    _, p_out = prefill(p_sched, p_worker)
    d_sched, d_worker = decode_scheduler()
    d_worker.kv_source = p_worker
    for req_id in ("early", "late"):
        req = make_request(req_id, 10, max_tokens=4)
        req.kv_transfer = p_out.kv_transfer
        d_sched.add_request(req)
    d_sched.abort(["early"])
    plan = d_sched.schedule()
    assert [load.req_id for load in plan.kv_loads] == ["late"]
    d_sched.abort(["late"])
    d_sched.update_from_output(plan, d_worker.execute(plan))
    assert d_sched.remote_kv.take_abandoned() == [p_out.kv_transfer] and d_sched.remote_kv.take_abandoned() == []
    assert d_sched.kv_cache_manager.num_free_blocks == 64 and not d_sched.has_unfinished()


def test_what_a_prefill_or_decode_instance_refuses():
    p_sched, p_worker = prefill_scheduler()
    _, p_out = prefill(p_sched, p_worker)
    both, _ = make_scheduler()  # not --role decode
    longer = make_request("x", 5, max_tokens=2)
    longer.kv_transfer = KVTransferParams(do_remote_decode=True)
    logprobs = make_request("y", 10, max_tokens=2)
    logprobs.sampling.prompt_logprobs = 1
    logprobs.kv_transfer = p_out.kv_transfer
    remote = make_request("z", 10, max_tokens=2)
    remote.kv_transfer = p_out.kv_transfer
    d_sched, _ = decode_scheduler()
    for sched, req, error in ((p_sched, longer, "needs max_tokens 1"), (both, remote, "serve --role decode"),
                              (d_sched, logprobs, "prompt logprobs")):
        assert not sched.add_request(req)
        assert error in sched.take_pending_outputs()[-1].error
    # refused at admission: the decode scheduler gives the lease back at once; the other one never pulls anything
    assert d_sched.remote_kv.take_abandoned() == [p_out.kv_transfer] and both.remote_kv.take_abandoned() == []


def test_a_preempted_prefill_stops_its_workers_serving_blocks_it_lost():
    sched, worker = prefill_scheduler(num_blocks=16, block_size=4)
    req = make_request("p", 10, max_tokens=1)
    req.kv_transfer = KVTransferParams(do_remote_decode=True)
    sched.add_request(req)
    plan = sched.schedule()
    assert [lease.req_id for lease in plan.kv_leases] == ["p"]
    sched._unqueue(req)
    sched._preempt(req)  # as the scheduler would before the step's result, under memory pressure
    sched.update_from_output(plan, worker.execute(plan))
    assert sched.schedule().kv_leases_ended[:1] == ["p"]
