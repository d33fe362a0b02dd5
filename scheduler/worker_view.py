"""What the workers already know, so each StepPlan carries only the difference.

Workers keep per-request state (token ids, block table) between steps. A request they do not hold is sent in
full; one they hold gets only its new block ids and the tokens it gained since (its sampled tokens: the
workers never append a token on their own, so every shard, sampling or not, holds the same tokens), except that
with async scheduling a step that starts at a token not known yet tells the one worker to append the token it
sampled (append_sampled), which counts as sent. Workers apply finished_req_ids before new_reqs, so an id may leave
and come back in one plan.
A block table the workers hold only ever grows: copy-on-write replaces blocks only in tables not sent yet.
"""
import dataclasses

from tinyvllm.protocol.messages import CachedRequestData, NewRequestData, StepPlan
from tinyvllm.scheduler.request import Request


class WorkerView:
    def __init__(self) -> None:
        self._sent_block_ids: dict[str, list[int]] = {}  # req_id -> the block table the workers hold
        self._sent_num_tokens: dict[str, int] = {}  # req_id -> how many of its tokens the workers hold
        self._dropped_req_ids: list[str] = []  # known to the workers, dropped since the last plan

    def knows(self, req_id: str) -> bool:
        return req_id in self._sent_block_ids

    def forget(self, req_id: str) -> None:
        """req_id finished or was preempted: the next plan tells the workers to drop it."""
        self._sent_num_tokens.pop(req_id, None)
        if self._sent_block_ids.pop(req_id, None) is not None:
            self._dropped_req_ids.append(req_id)

    def make_plan(self, step_id: int, scheduled: list[tuple[Request, int, int]],
                  block_copies: list[list[int]]) -> StepPlan:
        """scheduled: (request, first position the step computes, tokens it computes)."""
        new_reqs, cached_reqs = [], []
        for req, start, num_new in scheduled:
            sent = self._sent_block_ids.get(req.req_id)
            if sent is None:
                # A preempted request comes back with its outputs so far as part of its "prompt"; its prompt
                # logprobs went out with its first token, so they are not computed again.
                sampling = req.sampling
                if req.output_token_ids and sampling.prompt_logprobs is not None:
                    sampling = dataclasses.replace(sampling, prompt_logprobs=None)
                new_reqs.append(NewRequestData(req.req_id, req.all_token_ids, sampling, list(req.block_ids),
                                               start, num_new, req.num_prompt_tokens, list(req.eos_token_ids)))
                self._sent_block_ids[req.req_id] = list(req.block_ids)
                self._sent_num_tokens[req.req_id] = req.num_tokens
            else:
                new_block_ids = req.block_ids[len(sent):]
                new_token_ids = req.token_ids_between(self._sent_num_tokens[req.req_id], req.num_tokens)
                append_sampled = start == req.num_tokens
                cached_reqs.append(CachedRequestData(req.req_id, new_block_ids, start, num_new, new_token_ids,
                                                     append_sampled, list(req.draft_token_ids)))
                sent += new_block_ids
                self._sent_num_tokens[req.req_id] = req.num_tokens + append_sampled
        plan = StepPlan(step_id, new_reqs, cached_reqs, self._dropped_req_ids, block_copies)
        self._dropped_req_ids = []
        return plan
