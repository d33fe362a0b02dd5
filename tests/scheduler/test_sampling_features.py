"""Scheduler support for the sampling features: min_tokens holds off EOS and stop ids, embedding requests run as
prefill-only requests that end with their vector, prompt logprobs bypass the prefix cache and forking (and are
not recomputed after preemption), and the worker's logprobs reach the outputs."""
from fake_worker import (EOS, default_token_fn, eos_at, fake_embedding, make_request, make_scheduler,
                         run_to_completion, step, tokens_of)
from invariants import check_scheduler_invariants
from tinyvllm.protocol.messages import FinishReason, StepResult, TokenLogprobs


def test_min_tokens_holds_off_eos_and_stop_ids():
    stop = default_token_fn("a", 6)
    sched, worker = make_scheduler(token_fn=eos_at({"a": 5}))
    sched.add_request(make_request("a", 5, max_tokens=10, min_tokens=3, stop_token_ids=[stop]))
    outputs = run_to_completion(sched, worker)["a"]
    tokens = tokens_of(outputs)
    # EOS as the first output and the stop id as the second are ignored; the request runs to max_tokens.
    assert tokens[:2] == [EOS, stop] and stop not in tokens[2:] and len(tokens) == 10
    assert outputs[-1].finish_reason == FinishReason.LENGTH


def test_min_tokens_reached_then_eos_stops():
    sched, worker = make_scheduler(token_fn=eos_at({"a": 7}))
    sched.add_request(make_request("a", 5, max_tokens=10, min_tokens=3))
    outputs = run_to_completion(sched, worker)["a"]
    assert tokens_of(outputs)[-1] == EOS and len(tokens_of(outputs)) == 3
    assert outputs[-1].finish_reason == FinishReason.STOP


def test_embedding_request_is_prefill_only_and_frees_its_blocks():
    sched, worker = make_scheduler(max_num_batched_tokens=8)
    sched.add_request(make_request("e", 19, embed=True))
    sched.add_request(make_request("g", 5, max_tokens=3))
    outputs = run_to_completion(sched, worker)
    (out,) = outputs["e"]
    assert out.finish_reason == FinishReason.STOP and out.new_token_ids == [] and out.num_prompt_tokens == 19
    assert out.embedding == fake_embedding(make_request("e", 19).prompt_token_ids)
    assert worker.num_computed_by_req["e"] == 19  # in chunks of the 8-token budget, never a decode
    assert len(tokens_of(outputs["g"])) == 3
    kv = sched.kv_cache_manager
    assert kv.num_free_blocks == kv.num_total_blocks


def test_every_position_requests_skip_prefix_cache_hits():
    sched, worker = make_scheduler()
    prompt = make_request("warm", 17).prompt_token_ids
    sched.add_request(make_request("warm", 17, max_tokens=2, prompt=prompt))
    run_to_completion(sched, worker)
    for req_id, extra in (("plain", {}), ("echo", {"prompt_logprobs": 1}), ("emb", {"embed": True})):
        sched.add_request(make_request(req_id, 17, max_tokens=2, prompt=prompt, **extra))
        run_to_completion(sched, worker)
    assert worker.num_computed_by_req["plain"] < 17  # the cache served it
    assert worker.num_computed_by_req["echo"] >= 17 and worker.num_computed_by_req["emb"] == 17


def test_prompt_logprobs_children_do_not_fork():
    sched, worker = make_scheduler()
    sched.add_request(make_request("p", 9, max_tokens=2, n=2, prompt_logprobs=0, temperature=1.0, seed=1))
    run_to_completion(sched, worker)
    assert worker.num_computed_by_req["p#0"] >= 9 and worker.num_computed_by_req["p#1"] >= 9


def test_resumed_request_does_not_ask_for_prompt_logprobs_again():
    sched, worker = make_scheduler(num_blocks=6, block_size=4)
    sched.add_request(make_request("old", 10, max_tokens=12, ignore_eos=True))
    sched.add_request(make_request("new", 6, max_tokens=12, prompt_logprobs=2, ignore_eos=True))
    sent = []
    for _ in range(40):
        plan = sched.schedule()
        if plan is None:
            break
        sent += [(r.req_id, len(r.prompt_token_ids), r.sampling.prompt_logprobs) for r in plan.new_reqs]
        sched.update_from_output(plan, worker.execute(plan))
        check_scheduler_invariants(sched)
    resumed = [s for s in sent if s[0] == "new"][1:]
    assert sched.num_preemptions > 0 and resumed, sent
    assert all(plp is None for _, n, plp in resumed if n > 6)


def test_worker_logprobs_reach_the_outputs():
    sched, worker = make_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=4, logprobs=1, prompt_logprobs=1))
    plan = sched.schedule()
    result = worker.execute(plan)
    sample_lp = TokenLogprobs(result.sampled_token_ids[0], -0.5, [7], [-0.1])
    prompt_lps = [TokenLogprobs(t, -1.0) for t in make_request("a", 5).prompt_token_ids[1:]]
    result = StepResult(result.step_id, 0, result.req_ids, result.sampled_token_ids, 0.0, [sample_lp], [prompt_lps])
    (out,) = sched.update_from_output(plan, result)
    assert out.logprobs == [sample_lp] and out.prompt_logprobs == prompt_lps
    _, outs = step(sched, worker)  # the fake worker sends none: the output has none
    assert outs["a"].logprobs is None and outs["a"].prompt_logprobs is None
