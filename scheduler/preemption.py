"""Who gives way when a running request needs a KV block and none is free: the newest running request (vLLM's
preemption), but never one in a step in flight, whose blocks the workers are writing. How it gives way
(Scheduler._preempt): its KV is swapped out to host memory (scheduler/swap.py) or dropped and recomputed when it
resumes."""
from tinyvllm.scheduler.request import Request
from tinyvllm.scheduler.steps_in_flight import StepsInFlight


def choose_victim(req: Request, running: list[Request], in_flight: StepsInFlight) -> Request | None:
    """The newest request in `running` (arrival order) newer than req and in no step in flight; else req itself,
    but None while a newer request is in flight: that one can give way once its step is back, so req waits and
    keeps its priority by age. None too if req is in flight itself (async scheduling plans it again): it waits."""
    newer = running[running.index(req) + 1:]
    movable = [r for r in newer if not in_flight.holds(r)]
    if movable:
        return movable[-1]
    return None if newer or in_flight.holds(req) else req

