"""Between a worker's StepResult and the frontend: the result's shape is checked, each request's news becomes a
RequestOutput (under the parent's id for a parallel-sampling child)."""
from tinyvllm.protocol.messages import ErrorKind, RequestOutput, StepResult
from tinyvllm.scheduler.request import Request


def well_formed(result: StepResult, step_id: int) -> bool:
    n = len(result.req_ids)
    return (result.step_id == step_id and len(result.sampled_token_ids) == n
            and len(result.logprobs) in (0, n) and len(result.prompt_logprobs) in (0, n)
            and len(result.accepted_draft_ids) in (0, n) and len(result.proposed_draft_ids) in (0, n)
            and len(result.pooled_req_ids) == len(result.embeddings)
            and len(result.failed_req_ids) == len(result.failed_reasons))


def request_output(req: Request, token_ids: list[int], reason: str | None, error: str | None = None,
                   error_kind: str = ErrorKind.ENGINE_FAILURE) -> RequestOutput:
    out = RequestOutput(req.output_id, token_ids, reason, req.num_prompt_tokens, req.num_cached_tokens or 0,
                        error, req.index)
    out.queue_time_s = req.queue_time_s
    out.kv_transfer = req.kv_transfer_out
    if error is not None:
        out.error_kind = error_kind
    return out


def sampled_output(req: Request, reason: str | None, result: StepResult, row: int,
                   token_ids: list[int]) -> RequestOutput:
    """The tokens req gained in row `row` of result (its accepted drafts and sampled token, or only the sampled one),
    with its logprobs and prompt logprobs if it asked (requests that ask get no drafts)."""
    out = request_output(req, token_ids, reason)
    if result.logprobs and result.logprobs[row] is not None:
        out.logprobs = [result.logprobs[row]]
    if result.prompt_logprobs:
        out.prompt_logprobs = result.prompt_logprobs[row]
    return out
