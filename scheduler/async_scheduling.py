"""Async scheduling (vLLM V1's AsyncScheduler): plan a request again while its step is still in flight.

A request's next step starts where its steps in flight end (num_computed_tokens + the tokens they compute). Its
known tokens (the rest of a prompt) may be planned at once. A step that reaches the end of its known tokens samples
one; the next step may then compute that token too, before it is known: a placeholder, which the worker fills with
the token it sampled itself (CachedRequestData.append_sampled). So it is only for one worker (world size 1): other
ranks never see the sampled token. At most one placeholder per request is outstanding, and none is planned that
could only be wasted: past max_tokens or the longest length counting the outstanding token, or for a request that
samples nothing (embeddings). If the outstanding token ends the request (EOS, a stop token), the step computing
it is wasted: its result for the request is ignored, as for an abort in flight.
"""
from tinyvllm.scheduler.request import Request
from tinyvllm.scheduler.steps_in_flight import StepsInFlight


def tokens_to_plan(req: Request, start: int, budget: int, in_flight: StepsInFlight, async_scheduling: bool,
                   max_len: int) -> int:
    """How many tokens from `start` (where req's steps in flight end) the step being planned computes for running
    req; 0: none this step."""
    if in_flight.holds(req) and not async_scheduling:
        return 0
    if start < req.compute_limit:
        return min(req.compute_limit - start, budget)
    if start == req.num_tokens and in_flight.holds(req) and placeholder_may_be_used(req, max_len):
        return 1
    return 0  # a leader waiting to fork, or a placeholder already outstanding


def placeholder_may_be_used(req: Request, max_len: int) -> bool:
    """Whether the token req's step in flight samples may not end it for a reason known in advance."""
    return (not req.sampling.pools and req.num_output_tokens + 1 < req.sampling.max_tokens
            and req.num_tokens + 1 < max_len)
