"""Drives a Scheduler with up to max_steps_in_flight plans outstanding, as SchedulerLoop does: plan while fewer are
out and schedule() has something, then take the oldest plan's result. The fake worker runs each plan only when its
result is taken: in plan order, after the later plans were made and any aborts in between were applied."""
from collections import deque

from fake_worker import FakeWorker
from invariants import check_scheduler_invariants
from tinyvllm.protocol.messages import RequestOutput, StepPlan
from tinyvllm.scheduler.scheduler import Scheduler


def scheduled_ids(plan: StepPlan) -> set[str]:
    return {r.req_id for r in plan.new_reqs} | {r.req_id for r in plan.cached_reqs}


class InFlightDriver:
    def __init__(self, sched: Scheduler, worker: FakeWorker):
        self.sched, self.worker = sched, worker
        self.outstanding: deque[StepPlan] = deque()
        self.max_outstanding = 0  # the most plans ever out at once

    def fill(self) -> list[StepPlan]:
        """Plans until max_steps_in_flight are outstanding or schedule() has nothing; returns the new plans."""
        new = []
        while len(self.outstanding) < self.sched.config.max_steps_in_flight:
            plan = self.sched.schedule()
            check_scheduler_invariants(self.sched)
            if plan is None:
                break
            if not self.sched.config.async_scheduling:  # which may plan a request again (the fake worker checks how)
                for other in self.outstanding:
                    # An id the plan drops (aborted, finished) may come back as new; ids here are never reused.
                    assert not scheduled_ids(plan) & scheduled_ids(other), (
                        f"step {plan.step_id} repeats step {other.step_id}")
            self.outstanding.append(plan)
            new.append(plan)
        self.max_outstanding = max(self.max_outstanding, len(self.outstanding))
        return new

    def finish_oldest(self) -> list[RequestOutput]:
        plan = self.outstanding.popleft()
        outputs = self.sched.update_from_output(plan, self.worker.execute(plan))
        check_scheduler_invariants(self.sched)
        return outputs

    def step(self) -> list[RequestOutput] | None:
        """fill(), then the oldest plan's outputs; None when nothing was outstanding."""
        self.fill()
        return self.finish_oldest() if self.outstanding else None

    def run_to_completion(self, max_steps: int = 100_000) -> dict[str, list]:
        """Like fake_worker.run_to_completion: outputs per request id (the parent's for n > 1 children)."""
        outputs: dict[str, list] = {}
        for _ in range(max_steps):
            for out in self.sched.take_pending_outputs():
                outputs.setdefault(out.req_id, []).append(out)
            step_outputs = self.step()
            if step_outputs is None:
                assert not self.sched.has_unfinished(), "unfinished requests but nothing scheduled"
                return outputs
            for out in step_outputs:
                outputs.setdefault(out.req_id, []).append(out)
        raise AssertionError(f"not done after {max_steps} steps")
