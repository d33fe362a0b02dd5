import pytest

from fake_worker import EOS, default_token_fn, eos_at, make_request, make_scheduler, run_to_completion, tokens_of
from invariants import check_scheduler_invariants
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.scheduler.request import RequestStatus


def run_one(req, **config):
    sched, worker = make_scheduler(**config)
    assert sched.add_request(req)
    outputs = run_to_completion(sched, worker)[req.req_id]
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_total_blocks
    assert [o.finish_reason for o in outputs[:-1]] == [None] * (len(outputs) - 1)
    return tokens_of(outputs), outputs[-1].finish_reason


def test_eos_stops_and_is_included():
    tokens, reason = run_one(make_request("a", 5, max_tokens=10), token_fn=eos_at({"a": 7}))
    assert tokens == [default_token_fn("a", 5), default_token_fn("a", 6), EOS] and reason == FinishReason.STOP


def test_ignore_eos_runs_to_max_tokens():
    tokens, reason = run_one(make_request("a", 5, max_tokens=4, ignore_eos=True), token_fn=eos_at({"a": 6}))
    assert tokens[1] == EOS and len(tokens) == 4 and reason == FinishReason.LENGTH


def test_any_of_several_eos_ids_stops():
    req = make_request("a", 5, max_tokens=10, eos_token_ids=(99, EOS))
    assert run_one(req, token_fn=eos_at({"a": 6}))[1] == FinishReason.STOP


def test_eos_token_is_not_special_without_eos_ids():
    req = make_request("a", 5, max_tokens=3, eos_token_ids=())
    assert run_one(req, token_fn=eos_at({"a": 6}))[1] == FinishReason.LENGTH


def test_stop_token_ids_stop_even_with_ignore_eos():
    stop = default_token_fn("a", 8)
    tokens, reason = run_one(make_request("a", 5, max_tokens=10, stop_token_ids=[stop], ignore_eos=True))
    assert tokens[-1] == stop and len(tokens) == 4 and reason == FinishReason.STOP


def test_stop_on_the_last_allowed_token_reports_stop():
    assert run_one(make_request("a", 5, max_tokens=3), token_fn=eos_at({"a": 7}))[1] == FinishReason.STOP


@pytest.mark.parametrize("prompt_len, max_tokens, why", [
    (128, 16, "max_model_len"),  # prompt_len == max_model_len: no room to generate
    (0, 16, "empty"),
    (5, 0, "max_tokens"),
])
def test_impossible_requests_are_rejected_with_an_error(prompt_len, max_tokens, why):
    sched, _ = make_scheduler(max_model_len=128)
    req = make_request("bad", prompt_len, max_tokens=max_tokens)
    assert not sched.add_request(req)
    (out,) = sched.take_pending_outputs()
    assert out.req_id == "bad" and out.finish_reason == FinishReason.ERROR and why in out.error
    assert req.status is RequestStatus.FINISHED
    assert sched.schedule() is None and not sched.has_unfinished() and sched.take_pending_outputs() == []


def test_a_prompt_bigger_than_the_pool_is_rejected_but_one_that_fills_it_runs():
    sched, worker = make_scheduler(max_model_len=128, block_size=4, num_blocks=4)
    assert not sched.add_request(make_request("big", 17))
    (out,) = sched.take_pending_outputs()
    assert out.finish_reason == FinishReason.ERROR and "blocks" in out.error
    assert sched.add_request(make_request("fits", 16))
    outputs = run_to_completion(sched, worker)["fits"]
    assert len(tokens_of(outputs)) == 1 and outputs[-1].finish_reason == FinishReason.LENGTH


def test_duplicate_request_id_is_rejected_without_touching_the_original():
    sched, worker = make_scheduler()
    assert sched.add_request(make_request("a", 5, max_tokens=2))
    assert not sched.add_request(make_request("a", 5))
    (out,) = sched.take_pending_outputs()
    assert out.finish_reason == FinishReason.ERROR and "in use" in out.error
    assert len(tokens_of(run_to_completion(sched, worker)["a"])) == 2


def test_a_worker_that_drops_a_token_fails_the_request_instead_of_hanging():
    sched, worker = make_scheduler()
    sched.add_request(make_request("a", 5))
    sched.add_request(make_request("b", 5))
    plan = sched.schedule()
    result = worker.execute(plan)
    keep = [i for i, r in enumerate(result.req_ids) if r != "a"]
    result.req_ids = [result.req_ids[i] for i in keep]
    result.sampled_token_ids = [result.sampled_token_ids[i] for i in keep]
    outs = {o.req_id: o for o in sched.update_from_output(plan, result)}
    assert outs["a"].finish_reason == FinishReason.ERROR and outs["b"].finish_reason is None
    check_scheduler_invariants(sched)


def test_one_step_in_flight_at_a_time():
    sched, worker = make_scheduler()
    sched.add_request(make_request("a", 5))
    plan = sched.schedule()
    with pytest.raises(RuntimeError):
        sched.schedule()
    result = worker.execute(plan)
    sched.update_from_output(plan, result)
    with pytest.raises(ValueError):
        sched.update_from_output(plan, result)


@pytest.mark.parametrize("bad_token", [-1, 2**31])
def test_token_ids_outside_int32_are_rejected_before_they_reach_the_hash_or_the_worker(bad_token):
    sched, _ = make_scheduler()
    assert not sched.add_request(make_request("bad", 0, prompt=[5, bad_token, 6]))
    (out,) = sched.take_pending_outputs()
    assert out.finish_reason == FinishReason.ERROR and "token ids" in out.error
