"""Async scheduling: with one worker, a request is planned again while its step is in flight, for a token the worker
sampled but the scheduler does not know yet (a placeholder: the worker appends its own token), or for the rest of
its prompt. Tokens come out in order and once; a token that ends the request wastes only the step planned after it."""
import pytest

from fake_worker import EOS, default_token_fn, eos_at, make_request, make_scheduler, run_to_completion, tokens_of
from in_flight_driver import InFlightDriver, scheduled_ids
from invariants import check_scheduler_invariants
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.protocol.process_args import SchedulerArgs
from tinyvllm.scheduler.main import scheduler_config


def async_scheduler(**kwargs):
    return make_scheduler(max_steps_in_flight=2, async_scheduling=True, **kwargs)


def plan(sched):
    new = sched.schedule()
    check_scheduler_invariants(sched)
    return new


def finish(sched, worker, step_plan):
    outputs = sched.update_from_output(step_plan, worker.execute(step_plan))
    check_scheduler_invariants(sched)
    return outputs


def test_a_decoding_request_is_planned_again_while_its_step_is_in_flight():
    sched, worker = async_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=6))
    first = plan(sched)  # the prompt: it samples the first token
    second = plan(sched)  # that token's position, before the token is known
    assert scheduled_ids(first) == scheduled_ids(second) == {"a"}
    (cached,) = second.cached_reqs
    assert (cached.num_computed_tokens, cached.num_scheduled_tokens, cached.new_token_ids, cached.append_sampled) == \
        (5, 1, [], True)
    with pytest.raises(RuntimeError, match="2 steps are in flight"):
        sched.schedule()
    tokens = []
    for _ in range(6):
        (out,) = finish(sched, worker, first)
        tokens += out.new_token_ids
        if out.finish_reason is not None:
            break
        first, second = second, plan(sched)
        if second is not None:  # the next one, again for the token the step in flight samples
            assert second.cached_reqs[0].append_sampled and second.cached_reqs[0].new_token_ids == []
    assert out.finish_reason == FinishReason.LENGTH and second is None
    assert tokens == [default_token_fn("a", pos) for pos in range(5, 11)]  # in order, each once
    assert worker.reqs["a"].token_ids == make_request("a", 5).prompt_token_ids + tokens[:-1]  # no token twice
    assert worker.num_scheduled_per_step == [5, 1, 1, 1, 1, 1]  # no step wasted
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_total_blocks


def test_a_stop_token_discards_the_next_steps_token_and_frees_the_blocks_at_once():
    sched, worker = async_scheduler(block_size=4, num_blocks=8, token_fn=eos_at({"a": 6}),
                                    enable_prefix_caching=False)
    sched.add_request(make_request("a", 5, max_tokens=10))
    first, second = plan(sched), plan(sched)
    (out,) = finish(sched, worker, first)
    assert out.finish_reason is None
    third = plan(sched)  # computes position 6, while the step in flight samples the EOS there
    (out,) = finish(sched, worker, second)
    assert out.new_token_ids == [EOS] and out.finish_reason == FinishReason.STOP
    assert sched.kv_cache_manager.num_free_blocks == 8 and not sched.has_unfinished()  # third is still in flight
    assert finish(sched, worker, third) == []  # its token for a is never sent
    sched.add_request(make_request("b", 3, max_tokens=1))
    fourth = plan(sched)
    assert fourth.finished_req_ids == ["a"]
    finish(sched, worker, fourth)
    assert "a" not in worker.reqs and sched.kv_cache_manager.num_free_blocks == 8


@pytest.mark.parametrize("max_tokens", [1, 2, 3])
def test_no_placeholder_past_max_tokens(max_tokens):
    sched, worker = async_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=max_tokens))
    outputs = InFlightDriver(sched, worker).run_to_completion()
    assert len(tokens_of(outputs["a"])) == max_tokens
    assert worker.num_scheduled_per_step == [5] + [1] * (max_tokens - 1)  # every step's token was used


def test_no_placeholder_past_max_model_len():
    sched, worker = async_scheduler(max_model_len=8)
    sched.add_request(make_request("a", 5, max_tokens=100))
    outputs = InFlightDriver(sched, worker).run_to_completion()
    assert outputs["a"][-1].finish_reason == FinishReason.LENGTH and len(tokens_of(outputs["a"])) == 3
    assert worker.num_scheduled_per_step == [5, 1, 1]


def test_a_long_prompt_goes_on_in_the_next_step_and_a_leader_waits_for_its_fork():
    sched, worker = async_scheduler(max_num_batched_tokens=4)
    sched.add_request(make_request("a", 10, max_tokens=2))
    steps = [plan(sched), plan(sched)]
    assert [(p.new_reqs + p.cached_reqs)[0].num_computed_tokens for p in steps] == [0, 4]
    driver = InFlightDriver(sched, worker)
    driver.outstanding.extend(steps)
    assert tokens_of(driver.run_to_completion()["a"]) == [default_token_fn("a", 10), default_token_fn("a", 11)]
    assert worker.num_scheduled_per_step == [4, 4, 2, 1]

    sched, worker = make_scheduler(max_num_batched_tokens=4, max_steps_in_flight=3, async_scheduling=True)
    sched.add_request(make_request("p", 7, max_tokens=2, n=2, seed=1))
    assert [(p.new_reqs + p.cached_reqs)[0].num_scheduled_tokens for p in (plan(sched), plan(sched))] == [4, 2]
    assert plan(sched) is None  # the leader stops short of its last prompt token until its result is in and it forks


def test_an_abort_with_two_steps_in_flight_frees_the_blocks_and_ignores_both_results():
    sched, worker = async_scheduler(block_size=4, num_blocks=4, enable_prefix_caching=False)
    sched.add_request(make_request("a", 8, max_tokens=6))
    first, second = plan(sched), plan(sched)
    assert second.cached_reqs[0].append_sampled
    sched.abort(["a"])
    assert [(o.req_id, o.finish_reason) for o in sched.take_pending_outputs()] == [("a", FinishReason.ABORT)]
    assert sched.kv_cache_manager.num_free_blocks == 4
    check_scheduler_invariants(sched)
    assert finish(sched, worker, first) == [] and finish(sched, worker, second) == []
    sched.add_request(make_request("b", 5, max_tokens=2))
    outputs = run_to_completion(sched, worker)
    assert set(outputs) == {"b"} and len(tokens_of(outputs["b"])) == 2 and "a" not in worker.reqs
    assert sched.kv_cache_manager.num_free_blocks == 4


def test_without_async_scheduling_a_request_in_flight_waits():
    sched, worker = make_scheduler(max_steps_in_flight=2)
    sched.add_request(make_request("a", 5))
    assert plan(sched) is not None and plan(sched) is None


@pytest.mark.parametrize("tp, pp, expected, steps_in_flight", [(1, 1, True, 2), (2, 1, False, 1), (1, 2, False, 2)])
def test_only_a_world_of_one_schedules_asynchronously(tp, pp, expected, steps_in_flight):
    args = SchedulerArgs(EngineConfig.of(tensor_parallel_size=tp, pipeline_parallel_size=pp, block_size=4,
                                         max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=64,
                                         async_scheduling=True, max_model_len=128))
    config = scheduler_config(args, 64)
    assert config.async_scheduling is expected and config.max_steps_in_flight == steps_in_flight


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_several_requests_come_out_the_same_either_way(async_scheduling):
    def run(**kwargs):
        sched, worker = make_scheduler(max_num_batched_tokens=8, block_size=2, num_blocks=24,
                                       token_fn=eos_at({"b": 9}), **kwargs)
        for name, prompt_len, max_tokens in (("a", 3, 9), ("b", 6, 12), ("c", 11, 4)):
            sched.add_request(make_request(name, prompt_len, max_tokens=max_tokens))
        return {k: tokens_of(v) for k, v in InFlightDriver(sched, worker).run_to_completion().items()}
    assert run(max_steps_in_flight=2, async_scheduling=async_scheduling) == run()
