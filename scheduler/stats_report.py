"""The running batch's summary that a scheduler's stats carry with every step (Scheduler.stats)."""
import itertools

from tinyvllm.protocol.batch_summary import MAX_REQUEST_ID_CHARS, MAX_SUMMARIZED_REQUESTS, RunningRequestSummary
from tinyvllm.scheduler.kv_cache_manager import held_blocks


def running_summaries(running) -> list[RunningRequestSummary]:
    """The oldest MAX_SUMMARIZED_REQUESTS running requests; a parallel-sampling child goes by its parent's id."""
    return [RunningRequestSummary((req.parent_id or req.req_id)[:MAX_REQUEST_ID_CHARS], req.num_prompt_tokens,
                                  req.num_output_tokens, len(held_blocks(req)))
            for req in itertools.islice(running, MAX_SUMMARIZED_REQUESTS)]

