"""What the workers already know, so each StepPlan carries only the difference.

Workers keep per-request state (token ids, block table) between steps and append the tokens they
sample themselves. A request they do not hold is sent in full; one they hold gets only its new block
ids. Workers apply finished_req_ids before new_reqs, so an id may leave and come back in one plan.
"""
from protocol.messages import CachedRequestData, NewRequestData, StepPlan
from scheduler.request import Request


class WorkerView:
    def __init__(self) -> None:
        self._num_block_ids_sent: dict[str, int] = {}  # req_id -> length of the block table the workers hold
        self._dropped_req_ids: list[str] = []  # known to the workers, dropped since the last plan

    def known_req_ids(self) -> set[str]:
        return set(self._num_block_ids_sent)

    def forget(self, req_id: str) -> None:
        """req_id finished or was preempted: the next plan tells the workers to drop it."""
        if self._num_block_ids_sent.pop(req_id, None) is not None:
            self._dropped_req_ids.append(req_id)

    def make_plan(self, step_id: int, scheduled: list[tuple[Request, int]]) -> StepPlan:
        new_reqs, cached_reqs = [], []
        for req, num_new in scheduled:
            num_sent = self._num_block_ids_sent.get(req.req_id)
            if num_sent is None:
                # A preempted request comes back with its outputs so far as part of its "prompt".
                new_reqs.append(NewRequestData(req.req_id, req.all_token_ids, req.sampling, list(req.block_ids),
                                               req.num_computed_tokens, num_new))
            else:
                cached_reqs.append(CachedRequestData(req.req_id, req.block_ids[num_sent:],
                                                     req.num_computed_tokens, num_new))
            self._num_block_ids_sent[req.req_id] = len(req.block_ids)
        plan = StepPlan(step_id, new_reqs, cached_reqs, self._dropped_req_ids)
        self._dropped_req_ids = []
        return plan
