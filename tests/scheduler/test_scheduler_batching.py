from fake_worker import default_token_fn, make_request, make_scheduler, run_to_completion, step, tokens_of
from tinyvllm.protocol.messages import FinishReason


def test_prefill_then_decode_sends_the_diff():
    sched, worker = make_scheduler(block_size=4)
    sched.add_request(make_request("a", prompt_len=7, max_tokens=3))

    plan, outs = step(sched, worker)
    (new,) = plan.new_reqs
    assert plan.cached_reqs == [] and plan.finished_req_ids == [] and plan.step_id == 1
    assert (new.num_computed_tokens, new.num_scheduled_tokens, len(new.block_ids)) == (0, 7, 2)
    assert outs["a"].new_token_ids == [default_token_fn("a", 7)] and outs["a"].num_prompt_tokens == 7

    plan, outs = step(sched, worker)  # token 8 goes to slot 7, still block 2
    (cached,) = plan.cached_reqs
    assert plan.new_reqs == [] and (cached.num_computed_tokens, cached.num_scheduled_tokens) == (7, 1)
    assert cached.new_block_ids == []

    plan, outs = step(sched, worker)  # slot 8 needs a third block
    assert len(plan.cached_reqs[0].new_block_ids) == 1
    assert outs["a"].finish_reason == FinishReason.LENGTH
    assert sched.kv_cache_manager.num_free_blocks == 64 and not sched.has_unfinished()
    assert sched.schedule() is None

    sched.add_request(make_request("b", 3))
    plan, _ = step(sched, worker)
    assert plan.finished_req_ids == ["a"] and [r.req_id for r in plan.new_reqs] == ["b"]


def test_new_requests_join_the_running_batch_next_step():
    sched, worker = make_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=10))
    step(sched, worker)
    sched.add_request(make_request("b", 5, max_tokens=10))
    plan, outs = step(sched, worker)
    assert [r.req_id for r in plan.cached_reqs] == ["a"] and [r.req_id for r in plan.new_reqs] == ["b"]
    assert set(outs) == {"a", "b"}


def test_finished_requests_leave_at_once():
    sched, worker = make_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=1))
    sched.add_request(make_request("b", 5, max_tokens=5))
    _, outs = step(sched, worker)
    assert outs["a"].finish_reason == FinishReason.LENGTH and outs["b"].finish_reason is None
    assert sched.num_running == 1 and sched.kv_cache_manager.num_free_blocks == 64 - 2
    plan, _ = step(sched, worker)
    assert plan.finished_req_ids == ["a"] and [r.req_id for r in plan.cached_reqs] == ["b"]


def test_batch_limits_hold_every_step():
    sched, worker = make_scheduler(max_num_seqs=4, max_num_batched_tokens=16, num_blocks=256)
    reqs = [make_request(f"r{i}", prompt_len=1 + (7 * i) % 30, max_tokens=1 + (5 * i) % 9) for i in range(20)]
    for req in reqs:
        sched.add_request(req)
    outputs = run_to_completion(sched, worker)
    assert max(worker.num_reqs_per_step) == 4 and max(worker.num_scheduled_per_step) == 16
    for req in reqs:
        assert len(tokens_of(outputs[req.req_id])) == req.sampling.max_tokens
        assert [o.finish_reason for o in outputs[req.req_id]][-1] == FinishReason.LENGTH


def test_long_prompt_is_chunked_alongside_decodes():
    sched, worker = make_scheduler(max_num_batched_tokens=16)
    sched.add_request(make_request("a", 4, max_tokens=10))
    step(sched, worker)
    sched.add_request(make_request("b", 40, max_tokens=2))
    chunks = []
    for _ in range(3):
        plan, outs = step(sched, worker)
        assert plan.cached_reqs[0].req_id == "a" and plan.cached_reqs[0].num_scheduled_tokens == 1
        b = (plan.new_reqs or plan.cached_reqs[1:])[0]
        chunks.append((b.num_computed_tokens, b.num_scheduled_tokens))
        assert ("b" in outs) == (b.num_computed_tokens + b.num_scheduled_tokens == 40)
    assert chunks == [(0, 15), (15, 15), (30, 10)]
    assert outs["b"].new_token_ids == [default_token_fn("b", 40)]


def test_waiting_queue_is_strict_fifo():
    sched, worker = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    sched.add_request(make_request("a", 12, max_tokens=20))  # 3 blocks
    step(sched, worker)
    sched.add_request(make_request("big", 16, max_tokens=1))  # 4 blocks: does not fit next to a
    sched.add_request(make_request("small", 2, max_tokens=1))  # would fit, but may not overtake
    plan, _ = step(sched, worker)
    assert plan.new_reqs == [] and sched.num_waiting == 2


def test_more_sequences_fit_than_with_max_model_len_preallocation():
    max_model_len, block_size = 64, 4
    num_blocks = 4 * max_model_len // block_size  # room for 4 sequences if each reserved max_model_len
    sched, worker = make_scheduler(max_num_seqs=32, max_model_len=max_model_len, block_size=block_size,
                                   num_blocks=num_blocks)
    for i in range(16):
        sched.add_request(make_request(f"r{i}", prompt_len=6, max_tokens=6))
    peak = 0

    def track(_):
        nonlocal peak
        peak = max(peak, sched.num_running)
    run_to_completion(sched, worker, on_step=track)
    assert max(worker.num_reqs_per_step) >= 8 and peak >= 8


def test_max_model_len_caps_generation():
    sched, worker = make_scheduler(max_model_len=13)
    sched.add_request(make_request("a", 10, max_tokens=100))
    outputs = run_to_completion(sched, worker)["a"]
    assert len(tokens_of(outputs)) == 3 and outputs[-1].finish_reason == FinishReason.LENGTH


def test_a_request_that_outgrows_the_whole_pool_ends_with_length():
    sched, worker = make_scheduler(max_model_len=64, block_size=4, num_blocks=4)
    sched.add_request(make_request("a", 10, max_tokens=100))
    outputs = run_to_completion(sched, worker)["a"]
    assert len(tokens_of(outputs)) == 16 + 1 - 10 and outputs[-1].finish_reason == FinishReason.LENGTH


def test_stats():
    sched, worker = make_scheduler(num_blocks=10, max_num_seqs=1)
    sched.add_request(make_request("a", 5))
    sched.add_request(make_request("b", 5))
    step(sched, worker)
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_free_blocks, stats.num_total_blocks, stats.step_id) == \
        (1, 1, 8, 10, 1)
    assert sched.num_running == 1 and sched.num_waiting == 1 and sched.has_unfinished()
