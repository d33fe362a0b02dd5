"""A message over the bound (codec.MAX_SEND_BYTES) goes in several, split by rows: the halving that finds the parts,
and a StepResult's parts and their merge. Only a message found too large is split; the usual one goes out whole."""
from collections.abc import Callable

from tinyvllm.protocol import codec
from tinyvllm.protocol.codec import MessageTooLarge, encode, fits_in_a_message
from tinyvllm.protocol.messages import StepResult


def fitting_ranges(num_rows: int, fits: Callable[[int, int], bool]) -> list[tuple[int, int]]:
    """Rows [0, num_rows) as consecutive ranges [lo, hi), in order, each one for which fits(lo, hi) holds: a range
    that does not fit is halved. A single row is a range of its own whether it fits or not (the caller checks)."""
    ranges, pending = [], [(0, num_rows)]
    while pending:
        lo, hi = pending.pop()
        if hi - lo <= 1 or fits(lo, hi):
            ranges.append((lo, hi))
        else:
            mid = (lo + hi) // 2
            pending += [(mid, hi), (lo, mid)]  # the stack pops the lower half first
    return ranges


def step_result_rows(result: StepResult, lo: int, hi: int) -> StepResult:
    """Rows [lo, hi) of `result`, numbering its sampled rows first, then its pooled (embedding) rows."""
    n = len(result.req_ids)
    s, p = slice(min(lo, n), min(hi, n)), slice(max(lo - n, 0), max(hi - n, 0))
    rows = StepResult(result.step_id, result.rank, result.req_ids[s], result.sampled_token_ids[s], result.elapsed_s,
                      result.logprobs[s], result.prompt_logprobs[s], result.pooled_req_ids[p], result.embeddings[p])
    rows.accepted_draft_ids, rows.proposed_draft_ids = result.accepted_draft_ids[s], result.proposed_draft_ids[s]
    return rows


def split_step_result(result: StepResult) -> list[StepResult]:
    """`result` as parts of its step, each under the bound; every part but the last says more_parts. Raises
    MessageTooLarge when a single row does not fit alone."""
    num_rows = len(result.req_ids) + len(result.pooled_req_ids)
    ranges = fitting_ranges(num_rows, lambda lo, hi: fits_in_a_message(step_result_rows(result, lo, hi)))
    parts = [step_result_rows(result, lo, hi) for lo, hi in ranges]
    for (lo, hi), part in zip(ranges, parts):
        if hi - lo == 1 and (size := len(encode(part))) > codec.MAX_SEND_BYTES:
            req_id = (part.req_ids or part.pooled_req_ids)[0]
            raise MessageTooLarge("StepResult", size, codec.MAX_SEND_BYTES,
                                  f": request {req_id!r} alone is too large for a message of step {result.step_id} "
                                  "(fewer prompt_logprobs or logprobs would fit)")
    for part in parts[:-1]:
        part.more_parts = True
    parts[0].kv_loaded_req_ids, parts[0].kv_failed_req_ids = result.kv_loaded_req_ids, result.kv_failed_req_ids
    parts[0].kv_failed_reasons = result.kv_failed_reasons
    parts[0].kv_disk_failed_block_ids = result.kv_disk_failed_block_ids
    parts[0].failed_req_ids, parts[0].failed_reasons = result.failed_req_ids, result.failed_reasons
    return parts


def merge_step_results(parts: list[StepResult]) -> StepResult:
    """The parts of one step's result as one StepResult. Logprobs lists stay empty or one per row: a part without
    them gets None in its rows when another part has them."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    merged = StepResult(first.step_id, first.rank, [], [], first.elapsed_s)
    with_logprobs, with_prompt_logprobs = any(p.logprobs for p in parts), any(p.prompt_logprobs for p in parts)
    with_drafts, with_proposals = any(p.accepted_draft_ids for p in parts), any(p.proposed_draft_ids for p in parts)
    for part in parts:
        merged.req_ids += part.req_ids
        merged.sampled_token_ids += part.sampled_token_ids
        if with_logprobs:
            merged.logprobs += part.logprobs or [None] * len(part.req_ids)
        if with_prompt_logprobs:
            merged.prompt_logprobs += part.prompt_logprobs or [None] * len(part.req_ids)
        if with_drafts:
            merged.accepted_draft_ids += part.accepted_draft_ids or [[] for _ in part.req_ids]
        if with_proposals:
            merged.proposed_draft_ids += part.proposed_draft_ids or [[] for _ in part.req_ids]
        merged.pooled_req_ids += part.pooled_req_ids
        merged.embeddings += part.embeddings
        merged.kv_loaded_req_ids += part.kv_loaded_req_ids
        merged.kv_failed_req_ids += part.kv_failed_req_ids
        merged.kv_failed_reasons += part.kv_failed_reasons
        merged.kv_disk_failed_block_ids += part.kv_disk_failed_block_ids
        merged.failed_req_ids += part.failed_req_ids
        merged.failed_reasons += part.failed_reasons
    return merged
