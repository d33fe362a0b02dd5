"""The scheduler's stats carry a bounded summary of its running batch and the count of cached free blocks, which
/dashboard shows (frontend/api/dashboard_snapshot.py)."""
from fake_worker import make_prompt, make_request, make_scheduler, run_to_completion, step
from invariants import num_cached_blocks

from tinyvllm.scheduler import stats_report


def test_the_batch_summary_lists_running_requests_with_their_tokens_and_blocks():
    sched, worker = make_scheduler(block_size=4, num_blocks=64)
    for req_id, prompt_len in (("a", 5), ("b", 9)):
        sched.add_request(make_request(req_id, prompt_len, max_tokens=8))
    step(sched, worker)
    step(sched, worker)
    summary = {r.req_id: r for r in sched.stats().running_requests}
    assert set(summary) == {"a", "b"}
    assert (summary["a"].num_prompt_tokens, summary["a"].num_output_tokens, summary["a"].num_blocks) == (5, 2, 2)
    assert (summary["b"].num_prompt_tokens, summary["b"].num_output_tokens, summary["b"].num_blocks) == (9, 2, 3)
    run_to_completion(sched, worker)
    assert sched.stats().running_requests == []


def test_the_batch_summary_is_bounded_and_ids_are_cut(monkeypatch):
    monkeypatch.setattr(stats_report, "MAX_SUMMARIZED_REQUESTS", 2)
    sched, worker = make_scheduler(block_size=4, num_blocks=64)
    for i in range(4):
        sched.add_request(make_request("r" * 100 + str(i), 4, max_tokens=8))
    step(sched, worker)
    stats = sched.stats()
    assert stats.num_running == 4 and len(stats.running_requests) == 2
    assert all(len(r.req_id) == stats_report.MAX_REQUEST_ID_CHARS for r in stats.running_requests)


def test_cached_free_blocks_are_counted_until_evicted():
    sched, worker = make_scheduler(block_size=4, num_blocks=6)
    for req_id in ("x", "y"):  # each leaves its 2 full prompt blocks in the cache
        sched.add_request(make_request(req_id, 0, max_tokens=1, prompt=make_prompt(req_id, 8)))
        run_to_completion(sched, worker)
    stats = sched.stats()
    assert (stats.num_free_blocks, stats.num_cached_free_blocks) == (6, 4)
    sched.add_request(make_request("z", 16, max_tokens=4))  # its prompt takes 4 blocks, evicting 2 cached ones
    step(sched, worker)
    stats = sched.stats()
    assert stats.running_requests[0].num_blocks == 4
    assert (stats.num_free_blocks, stats.num_cached_free_blocks) == (2, 2)
    run_to_completion(sched, worker)
    assert sched.stats().num_cached_free_blocks == num_cached_blocks(sched.kv_cache_manager.pool)
