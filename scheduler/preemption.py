"""Who gives way when a running request needs a KV block and none is free: the newest running request (vLLM's
preemption), but never one in a step in flight, whose blocks the workers are writing; and how it gives way: its KV is
swapped out to host memory (scheduler/swap.py) or dropped and recomputed when it resumes."""
from typing import TYPE_CHECKING

from tinyvllm.scheduler.request import Request, RequestStatus
from tinyvllm.scheduler.steps_in_flight import StepsInFlight

if TYPE_CHECKING:
    from tinyvllm.scheduler.scheduler import Scheduler


def choose_victim(req: Request, running: list[Request], in_flight: StepsInFlight) -> Request | None:
    """The newest request in `running` (arrival order) newer than req and in no step in flight; else req itself,
    but None while a newer request is in flight: that one can give way once its step is back, so req waits and
    keeps its priority by age. None too if req is in flight itself (async scheduling plans it again): it waits."""
    newer = running[running.index(req) + 1:]
    movable = [r for r in newer if not in_flight.holds(r)]
    if movable:
        return movable[-1]
    return None if newer or in_flight.holds(req) else req


def preempt(sched: "Scheduler", req: Request) -> None:
    """Frees req's blocks and requeues it at the front (the caller took it out of running). Swapped out, it resumes
    where it was once its slots are copied back; else it resumes through the prefix cache and recomputes the rest
    of prompt + outputs so far."""
    sched.remote_kv.preempted(req)
    kv = sched.kv_cache_manager
    if sched.swap.should_swap(req, kv):
        sched.swap.swap_out(req, kv)
    else:
        req.num_computed_tokens = 0
    kv.free(req)
    req.status, req.draft_token_ids = RequestStatus.WAITING, []  # drafts of a step it was not planned in
    req.num_preemptions += 1
    sched.num_preemptions += 1
    sched.waiting.appendleft(req)
    sched.worker_view.forget(req.req_id)
