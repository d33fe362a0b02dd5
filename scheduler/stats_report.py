"""The SchedulerStats a scheduler reports with every step: counts, cumulative counters and its batch's summary."""
import itertools

from tinyvllm.protocol.batch_summary import MAX_REQUEST_ID_CHARS, MAX_SUMMARIZED_REQUESTS, RunningRequestSummary
from tinyvllm.protocol.messages import SchedulerStats
from tinyvllm.scheduler.kv_cache_manager import held_blocks


def running_summaries(running) -> list[RunningRequestSummary]:
    """The oldest MAX_SUMMARIZED_REQUESTS running requests; a parallel-sampling child goes by its parent's id."""
    return [RunningRequestSummary((req.parent_id or req.req_id)[:MAX_REQUEST_ID_CHARS], req.num_prompt_tokens,
                                  req.num_output_tokens, len(held_blocks(req)))
            for req in itertools.islice(running, MAX_SUMMARIZED_REQUESTS)]


def scheduler_stats(sched) -> SchedulerStats:
    kv, swap = sched.kv_cache_manager, sched.swap
    stats = SchedulerStats(
        sched.num_running, sched.num_waiting, kv.num_free_blocks, kv.num_total_blocks, sched._step_id,
        sched.prefix_cache_queries, sched.prefix_cache_hits, sched.num_preemptions, sched.num_tokens_computed,
        swap.num_free_slots, swap.num_slots, swap.num_swapped_out_blocks, swap.num_swapped_in_blocks,
        num_cached_free_blocks=kv.pool.num_cached_free_blocks, running_requests=running_summaries(sched.running))
    return sched.spec.add_stats(stats)
