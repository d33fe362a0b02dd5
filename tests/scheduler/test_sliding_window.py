"""Sliding windows in the scheduler: a model whose every layer attends to the last W positions only (Mistral) needs
a request's blocks only for its window, so the blocks behind it go back to the pool as the request advances and a
request longer than the whole cache runs. The fake worker reads (and checks) only the window."""
from fake_worker import make_request, make_scheduler, run_to_completion, tokens_of
from fake_worker import default_token_fn
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.scheduler.kv_cache_manager import FREED


def test_a_request_longer_than_the_cache_runs_holding_only_its_window():
    sched, worker = make_scheduler(block_size=4, num_blocks=8, max_num_batched_tokens=8, max_model_len=256,
                                   sliding_window=7)
    assert sched.config.blocks_per_request == 5  # ceil((7 - 1 + 8) / 4) + 1
    req = make_request("long", prompt_len=40, max_tokens=60)
    assert sched.add_request(req)  # 100 tokens: 25 blocks, the cache has 8
    held = []
    outputs = run_to_completion(sched, worker, on_step=lambda _: held.append(
        sum(block != FREED for block in req.block_ids)))
    assert tokens_of(outputs["long"]) == [default_token_fn("long", p) for p in range(40, 100)]
    assert outputs["long"][-1].finish_reason == FinishReason.LENGTH and sched.num_preemptions == 0
    assert max(held) <= sched.config.blocks_per_request
    assert sched.kv_cache_manager.num_free_blocks == 8


def test_freed_blocks_stay_in_the_prefix_cache():
    sched, worker = make_scheduler(block_size=4, num_blocks=12, max_num_batched_tokens=8, max_model_len=256,
                                   sliding_window=5)
    first = make_request("a", prompt_len=30, max_tokens=4)
    assert sched.add_request(first)
    run_to_completion(sched, worker)
    second = make_request("b", prompt_len=0, max_tokens=4, prompt=list(first.prompt_token_ids))
    assert sched.add_request(second)
    outputs = run_to_completion(sched, worker)
    assert outputs["b"][0].num_cached_tokens == 28  # 7 full blocks: all but the last token's
    assert tokens_of(outputs["b"]) == [default_token_fn("b", p) for p in range(30, 34)]


def test_without_a_window_the_same_request_is_refused():
    sched, _ = make_scheduler(block_size=4, num_blocks=8, max_num_batched_tokens=8, max_model_len=256)
    assert not sched.add_request(make_request("long", prompt_len=40, max_tokens=60))
    (error,) = sched.take_pending_outputs()
    assert "the whole cache only has 8 blocks" in error.error


def test_a_cache_smaller_than_a_window_and_a_chunk_is_refused_with_the_reason():
    sched, _ = make_scheduler(block_size=4, num_blocks=4, max_num_batched_tokens=8, max_model_len=256,
                              sliding_window=7)
    assert not sched.add_request(make_request("r", prompt_len=3))
    (error,) = sched.take_pending_outputs()
    assert "may hold 5 KV cache blocks" in error.error and "sliding window" in error.error


def test_a_cached_prefix_longer_than_the_cache_is_taken_from_behind_the_window():
    """The hit of a prompt that an earlier request computed may span more blocks than the whole cache: admission
    holds only the hit's blocks inside the window of its first new token, so the request runs (and the queue behind
    it too)."""
    sched, worker = make_scheduler(block_size=4, num_blocks=8, max_num_batched_tokens=8, max_model_len=256,
                                   sliding_window=7)
    first = make_request("a", prompt_len=29, max_tokens=1)
    assert sched.add_request(first)
    run_to_completion(sched, worker)
    prompt = list(first.prompt_token_ids) + list(range(1000, 1012))
    assert sched.add_request(make_request("b", prompt_len=0, max_tokens=2, prompt=prompt))
    assert sched.add_request(make_request("c", prompt_len=5, max_tokens=2))
    outputs = run_to_completion(sched, worker)
    assert outputs["b"][0].num_cached_tokens == 28  # 7 blocks hit, more than the 5 a request holds at once
    assert tokens_of(outputs["b"]) == [default_token_fn("b", p) for p in (41, 42)]
    assert tokens_of(outputs["c"]) == [default_token_fn("c", p) for p in (5, 6)]


def test_a_prompt_whose_kv_moves_between_instances_must_fit_the_cache_whole():
    """Disaggregated prefill leases all of a prompt's blocks (and a decode instance loads all of them): the window
    does not shrink what such a request holds, so a prompt longer than the cache is refused up front."""
    from tinyvllm.protocol.messages import KVTransferParams
    sched, _ = make_scheduler(block_size=4, num_blocks=8, max_num_batched_tokens=8, max_model_len=256,
                              sliding_window=7)
    req = make_request("p", prompt_len=40, max_tokens=1)
    req.kv_transfer = KVTransferParams(do_remote_decode=True)
    assert not sched.add_request(req)
    (error,) = sched.take_pending_outputs()
    assert "the whole cache only has 8 blocks" in error.error
