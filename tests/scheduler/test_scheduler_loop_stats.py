"""The stats SchedulerLoop sends the frontend (dashboard, /metrics, the data-parallel router) show requests the
scheduler has taken on at once, not only once the step computing them is back: a step can take long (a bucket's
first jit capture, a loaded machine), and until then the engine would look idle while it works."""
import queue
import threading

import zmq

from fake_worker import FakeWorker, make_prompt, make_scheduler
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.messages import AddRequest, Shutdown, StepOutputs, StepPlan
from tinyvllm.protocol.process_args import SchedulerArgs
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.protocol.transport import Endpoints, make_socket, recv, send
from tinyvllm.scheduler.main import SchedulerLoop

WAIT_MS = 10_000


class HeldWorker:
    """WorkerGroup after its handshake, one rank: a thread of its own runs the plans in order on the fake worker, but
    answers none until `answer` is set (a step that takes long)."""
    output_rank = 0

    def __init__(self, ctx: zmq.Context, worker: FakeWorker):
        self.sock = make_socket(ctx, zmq.PULL, "inproc://held-worker", bind=True)
        self.plans: queue.Queue[StepPlan | None] = queue.Queue()
        self.answer = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ctx, worker), daemon=True)
        self.thread.start()

    def broadcast(self, msg, skip_gone: bool = False) -> None:
        if isinstance(msg, StepPlan):
            self.plans.put(msg)

    def recv(self, deadline: float):
        return b"", recv(self.sock)

    def stop(self) -> None:
        self.answer.set()
        self.plans.put(None)
        self.thread.join(10)

    def _run(self, ctx: zmq.Context, worker: FakeWorker) -> None:
        results = make_socket(ctx, zmq.PUSH, "inproc://held-worker", bind=False)
        try:
            while (plan := self.plans.get()) is not None:
                self.answer.wait()
                send(results, worker.execute(plan))
        finally:
            results.close()


def test_requests_taken_on_are_in_the_stats_before_their_first_step_is_back():
    sched, worker = make_scheduler(max_steps_in_flight=2, async_scheduling=True)  # as `serve` runs one worker
    # inproc, on the loop's context: a message sent is there to read at once, so the loop takes both requests together
    endpoints = Endpoints("inproc://stats-scheduler-input", "inproc://stats-frontend-output", "inproc://stats-workers")
    loop = SchedulerLoop(endpoints, SchedulerArgs(EngineConfig.of(block_size=4, num_kv_blocks=64, max_model_len=128)))
    from_scheduler = make_socket(loop.ctx, zmq.PULL, endpoints.frontend_output, bind=True)
    to_scheduler = make_socket(loop.ctx, zmq.PUSH, endpoints.scheduler_input, bind=False)
    held = HeldWorker(loop.ctx, worker)
    loop.workers, loop.scheduler = held, sched
    req_ids = ["a", "b"]
    for req_id in req_ids:
        send(to_scheduler, AddRequest(req_id, make_prompt(req_id, 6), SamplingParams(max_tokens=4)))
    thread = threading.Thread(target=loop.loop, daemon=True)
    thread.start()
    try:
        # the worker holds the first step: what reaches the frontend now came before any step finished
        assert from_scheduler.poll(WAIT_MS), (
            f"the scheduler took on {req_ids} and sent their first step, but the frontend hears nothing of them (the "
            "stats it shows say idle) until that step's result is back")
        msg = recv(from_scheduler)
        assert isinstance(msg, StepOutputs) and msg.outputs == []
        assert (msg.stats.num_running, msg.stats.num_waiting) == (2, 0)  # both planned in the step in flight
        assert [r.req_id for r in msg.stats.running_requests] == req_ids

        held.answer.set()
        finished, stats = set(), None
        while finished != set(req_ids):
            assert from_scheduler.poll(WAIT_MS), "no StepOutputs"
            msg = recv(from_scheduler)
            finished |= {out.req_id for out in msg.outputs if out.finish_reason}
            stats = msg.stats
        assert stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks
    finally:
        send(to_scheduler, Shutdown("done"))  # a Shutdown also ends a wait for a step
        thread.join(10)
        held.stop()
        loop.ctx.destroy(linger=0)
    assert not thread.is_alive()


def test_a_request_that_arrives_during_a_step_is_never_reported_waiting_when_it_is_taken_on_next():
    """Reported after the step's result but before the next plan, it would show as waiting for a moment, and the
    data-parallel router weighs a waiting request as four running ones (4 streams split 3 to 1 on a loaded machine)."""
    sched, worker = make_scheduler(max_steps_in_flight=2, async_scheduling=True)
    endpoints = Endpoints("inproc://arrive-scheduler-input", "inproc://arrive-frontend-output", "inproc://arrive-workers")
    loop = SchedulerLoop(endpoints, SchedulerArgs(EngineConfig.of(block_size=4, num_kv_blocks=64, max_model_len=128)))
    from_scheduler = make_socket(loop.ctx, zmq.PULL, endpoints.frontend_output, bind=True)
    to_scheduler = make_socket(loop.ctx, zmq.PUSH, endpoints.scheduler_input, bind=False)
    held = HeldWorker(loop.ctx, worker)
    loop.workers, loop.scheduler = held, sched
    send(to_scheduler, AddRequest("a", make_prompt("a", 6), SamplingParams(max_tokens=8)))
    thread = threading.Thread(target=loop.loop, daemon=True)
    thread.start()
    try:
        assert from_scheduler.poll(WAIT_MS)
        assert recv(from_scheduler).stats.num_running == 1  # "a" planned; its step is held
        send(to_scheduler, AddRequest("b", make_prompt("b", 6), SamplingParams(max_tokens=2)))
        threading.Event().wait(0.5)  # the loop, waiting for the held step, reads "b" meanwhile
        held.answer.set()
        reported, finished = [], set()
        while finished != {"a", "b"}:
            assert from_scheduler.poll(WAIT_MS), "no StepOutputs"
            msg = recv(from_scheduler)
            reported.append((msg.stats.num_running, msg.stats.num_waiting))
            finished |= {out.req_id for out in msg.outputs if out.finish_reason}
        assert all(waiting == 0 for _, waiting in reported), reported
        assert (2, 0) in reported, reported  # "b" ran beside "a"
    finally:
        send(to_scheduler, Shutdown("done"))
        thread.join(10)
        held.stop()
        loop.ctx.destroy(linger=0)
    assert not thread.is_alive()
