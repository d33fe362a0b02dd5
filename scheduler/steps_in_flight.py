"""The planned steps whose results have not come back yet, oldest first (vLLM V1's batch queue).

Without async scheduling a request is in at most one of them: it is planned again only once its step's result is
in, so the workers learn each sampled token from the next plan that schedules the request
(CachedRequestData.new_token_ids) and no step waits on another's token. With it (scheduler/async_scheduling.py) a
request may be in several, each continuing where the one before ends. Workers run plans strictly in order, so
results come back in plan order.
"""
from collections import deque

from tinyvllm.scheduler.request import Request

Step = dict[str, tuple[Request, int]]  # req_id -> (the request, tokens the step computes for it)


class StepsInFlight:
    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self._steps: deque[tuple[int, Step]] = deque()
        # By identity (an aborted request's id may come back as a new request): tokens its steps in flight compute.
        self._num_tokens: dict[Request, int] = {}

    def __len__(self) -> int:
        return len(self._steps)

    def is_full(self) -> bool:
        return len(self._steps) >= self.max_steps

    def holds(self, req: Request) -> bool:
        return req in self._num_tokens

    def num_tokens(self, req: Request) -> int:
        """Tokens req's steps in flight compute after its num_computed_tokens."""
        return self._num_tokens.get(req, 0)

    def add(self, step_id: int, scheduled: list[tuple[Request, int]]) -> None:
        assert not self.is_full()
        self._steps.append((step_id, {req.req_id: (req, num_new) for req, num_new in scheduled}))
        for req, num_new in scheduled:
            self._num_tokens[req] = self._num_tokens.get(req, 0) + num_new

    def oldest(self, step_id: int) -> Step:
        """The oldest step's requests; ValueError unless step_id is that step."""
        if not self._steps or self._steps[0][0] != step_id:
            expected = f"step {self._steps[0][0]}" if self._steps else "none"
            raise ValueError(f"plan {step_id} is not the oldest step in flight ({expected})")
        return self._steps[0][1]

    def pop_oldest(self) -> Step:
        _, step = self._steps.popleft()
        for req, num_new in step.values():
            self._num_tokens[req] -= num_new
            if not self._num_tokens[req]:
                del self._num_tokens[req]
        return step

    def requests(self) -> list[tuple[Request, int]]:
        """(request, tokens) of every step in flight, oldest step first: a request may appear more than once."""
        return [entry for _, step in self._steps for entry in step.values()]
