"""LoRA adapters in the scheduler: refused when the engine serves none; at most max_loras different adapters run at
once, requests of another wait in order while those needing no new slot (the base model, a running adapter) go
ahead; an adapter's requests never hit blocks cached by another or by the base model; a request the worker could not
run (its adapter unreadable) ends with the worker's reason and gives its blocks back."""
from fake_worker import make_request, make_scheduler, step
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.protocol.sampling import LoRARequest

A, B, C = (LoRARequest(name, i, f"/adapters/{name}") for i, name in enumerate("abc", 1))


def test_without_adapter_slots_a_request_with_an_adapter_is_refused():
    sched, _ = make_scheduler()
    assert not sched.add_request(make_request("r", 5, lora=A))
    (out,) = sched.take_pending_outputs()
    assert out.finish_reason == FinishReason.ERROR and "--enable-lora" in out.error


def test_requests_needing_no_new_slot_go_ahead_of_one_waiting_for_a_slot():
    sched, worker = make_scheduler(max_loras=1, max_num_batched_tokens=128)
    sched.add_request(make_request("a1", 5, max_tokens=20, lora=A))
    step(sched, worker)
    for req_id, adapter in (("b1", B), ("base", None), ("a2", A), ("c1", C), ("b2", B)):
        sched.add_request(make_request(req_id, 5, max_tokens=20, lora=adapter))
    plan, _ = step(sched, worker)
    assert [r.req_id for r in plan.new_reqs] == ["base", "a2"]
    assert [r.req_id for r in sched.waiting] == ["b1", "c1", "b2"]
    assert sched.stats().running_lora_adapters == ["a"] and sched.stats().waiting_lora_adapters == ["b", "c"]
    while any(r.sampling.lora == A for r in sched.running):
        step(sched, worker)
    plan, _ = step(sched, worker)  # a's slot is free: b's requests, in order; c waits for b
    assert [r.req_id for r in plan.new_reqs] == ["b1", "b2"] and [r.req_id for r in sched.waiting] == ["c1"]


def test_adapters_never_hit_each_others_cached_blocks():
    sched, worker = make_scheduler(max_loras=2)
    prompt = list(range(100, 116))  # four full blocks
    for req_id, adapter in (("base", None), ("a", A), ("b", B), ("a-again", A)):
        sched.add_request(make_request(req_id, 16, max_tokens=1, prompt=prompt, lora=adapter))
        hits = sched.prefix_cache_hits
        while sched.has_unfinished():
            step(sched, worker)
        assert sched.prefix_cache_hits - hits == (12 if req_id == "a-again" else 0)  # its own blocks but the last


def test_a_request_the_worker_could_not_run_ends_with_its_reason_and_frees_its_blocks():
    sched, worker = make_scheduler(max_loras=1)
    sched.add_request(make_request("bad", 9, lora=A))
    sched.add_request(make_request("good", 9))
    free = sched.kv_cache_manager.num_free_blocks
    plan = sched.schedule()
    result = worker.execute(plan)
    row = result.req_ids.index("bad")
    del result.req_ids[row], result.sampled_token_ids[row]
    result.failed_req_ids, result.failed_reasons = ["bad"], ["no PEFT LoRA adapter at /adapters/a"]
    outputs = {out.req_id: out for out in sched.update_from_output(plan, result)}
    assert outputs["bad"].finish_reason == FinishReason.ERROR and "no PEFT" in outputs["bad"].error
    assert outputs["good"].new_token_ids and [r.req_id for r in sched.running] == ["good"]
    assert sched.kv_cache_manager.num_free_blocks == free - 3  # only good's blocks are held
