"""A step's result applied to the scheduler: the requests' computed tokens advance (their full blocks enter the prefix
cache, a leader that reached its fork point forks), sampled tokens are appended and checked for a stop, and each
request's news becomes a RequestOutput. With speculative decoding a request's news is the drafts the worker accepted,
then its sampled token: each counts as computed as it is appended (the rejected drafts do not), each is checked for a
stop, and the ones after a stop are dropped.

A request that finished or was aborted while the step was in flight is skipped: with async scheduling that includes
a step planned for a token that turned out to end the request, whose result for it is discarded."""
from typing import TYPE_CHECKING

from tinyvllm.protocol.messages import FinishReason, RequestOutput, StepResult
from tinyvllm.scheduler.request import Request, RequestStatus
from tinyvllm.scheduler.request_outputs import request_output, sampled_output
from tinyvllm.scheduler.steps_in_flight import Step

if TYPE_CHECKING:
    from tinyvllm.scheduler.scheduler import Scheduler


def apply_step_result(sched: "Scheduler", step: Step, result: StepResult) -> list[RequestOutput]:
    """Applies `result`, the worker's answer to `step` (already taken off the steps in flight); returns one output
    per request that gained a token or an embedding, or ended."""
    sched.disk_kv.apply(result)  # blocks filled from disk enter the prefix cache before anything is freed
    for req, num_new in step.values():
        if req.status is RequestStatus.RUNNING:
            num_new -= len(req.draft_token_ids)  # the drafts count as their tokens are appended (below)
            req.num_computed_tokens += num_new
            sched.num_tokens_computed += num_new
            sched.kv_cache_manager.cache_computed_blocks(req)
            if sched.config.sliding_window and not (req.kv_transfer and req.kv_transfer.do_remote_decode):
                sched.kv_cache_manager.free_behind_window(req, sched.config.sliding_window)  # a prefill's are leased
            if req.pending_forks and req.num_computed_tokens == req.num_prompt_tokens - 1:
                sched.fork(req)

    def caught_up(req_id: str) -> Request | None:
        req = step.get(req_id, (None, 0))[0]
        ok = req is not None and req.status is RequestStatus.RUNNING and req.num_computed_tokens == req.num_tokens
        return req if ok else None

    outputs = []
    for row, (req_id, token_id) in enumerate(zip(result.req_ids, result.sampled_token_ids)):
        if (req := caught_up(req_id)) is None:
            continue
        accepted = sched.spec.take_accepted(req, result.accepted_draft_ids[row] if result.accepted_draft_ids else [])
        new_tokens = append_until_stop(sched, req, accepted + [token_id])
        sched.spec.keep_proposals(req, result.proposed_draft_ids, row)
        reason = req.stop_reason(sched.max_len)
        if reason is not None:
            sched.finish(req, reason)
        elif accepted:
            sched.kv_cache_manager.cache_computed_blocks(req)
        outputs.append(sampled_output(req, reason, result, row, new_tokens))
    for req_id, embedding in zip(result.pooled_req_ids, result.embeddings):
        if (req := caught_up(req_id)) is not None:  # an embedding request is done once its prompt is
            sched.finish(req, FinishReason.STOP)
            out = request_output(req, [], FinishReason.STOP)
            out.embedding = embedding
            outputs.append(out)

    # A request that caught up without a token would never be scheduled again: end it rather than hang.
    for req, _ in step.values():
        if req.status is RequestStatus.RUNNING and req.num_computed_tokens == req.num_tokens:
            sched.finish(req, FinishReason.ERROR)
            outputs.append(request_output(req, [], FinishReason.ERROR, "the worker returned no token for this request"))
    if any(req.status is RequestStatus.FINISHED for req, _ in step.values()):
        sched.running = [req for req in sched.running if req.status is RequestStatus.RUNNING]
    return outputs


def append_until_stop(sched: "Scheduler", req: Request, token_ids: list[int]) -> list[int]:
    """Appends token_ids (accepted drafts, then the sampled token) up to the first that stops req; each but the last
    had its KV computed by the step. Returns those appended."""
    for i, token_id in enumerate(token_ids):
        req.output_token_ids.append(token_id)
        if i < len(token_ids) - 1:
            req.num_computed_tokens += 1
            sched.num_tokens_computed += 1
        if req.stop_reason(sched.max_len) is not None:
            return token_ids[:i + 1]
    return token_ids
