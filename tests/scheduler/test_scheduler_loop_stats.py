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


class HeldLoop:
    """A SchedulerLoop (one worker, async scheduling, as `serve` runs it) over a HeldWorker, on inproc sockets of the
    loop's own context (a message sent is there to read at once); `add` queues requests, `start` runs the loop."""

    def __init__(self, name: str):
        sched, worker = make_scheduler(max_steps_in_flight=2, async_scheduling=True)
        endpoints = Endpoints(f"inproc://{name}-input", f"inproc://{name}-output", f"inproc://{name}-workers")
        self.loop = SchedulerLoop(endpoints, SchedulerArgs(EngineConfig.of(block_size=4, num_kv_blocks=64,
                                                                           max_model_len=128)))
        self.from_scheduler = make_socket(self.loop.ctx, zmq.PULL, endpoints.frontend_output, bind=True)
        self.to_scheduler = make_socket(self.loop.ctx, zmq.PUSH, endpoints.scheduler_input, bind=False)
        self.held = HeldWorker(self.loop.ctx, worker)
        self.loop.workers, self.loop.scheduler = self.held, sched
        self.thread = threading.Thread(target=self.loop.loop, daemon=True)

    def add(self, req_id: str, max_tokens: int) -> None:
        send(self.to_scheduler, AddRequest(req_id, make_prompt(req_id, 6), SamplingParams(max_tokens=max_tokens)))

    def next_message(self) -> StepOutputs:
        assert self.from_scheduler.poll(WAIT_MS), "no StepOutputs"
        return recv(self.from_scheduler)

    def close(self) -> None:
        send(self.to_scheduler, Shutdown("done"))  # a Shutdown also ends a wait for a step
        self.thread.join(10)
        self.held.stop()
        self.loop.ctx.destroy(linger=0)
        assert not self.thread.is_alive()


def test_requests_taken_on_are_in_the_stats_before_their_first_step_is_back():
    held = HeldLoop("stats")
    req_ids = ["a", "b"]
    for req_id in req_ids:
        held.add(req_id, max_tokens=4)  # both there before the loop starts: it takes them together
    held.thread.start()
    try:
        # the worker holds the first step: what reaches the frontend now came before any step finished
        assert held.from_scheduler.poll(WAIT_MS), (
            f"the scheduler took on {req_ids} and sent their first step, but the frontend hears nothing of them (the "
            "stats it shows say idle) until that step's result is back")
        msg = held.next_message()
        assert isinstance(msg, StepOutputs) and msg.outputs == []
        assert (msg.stats.num_running, msg.stats.num_waiting) == (2, 0)  # both planned in the step in flight
        assert [r.req_id for r in msg.stats.running_requests] == req_ids

        held.held.answer.set()
        finished, stats = set(), None
        while finished != set(req_ids):
            msg = held.next_message()
            finished |= {out.req_id for out in msg.outputs if out.finish_reason}
            stats = msg.stats
        assert stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks
    finally:
        held.close()


def test_a_request_that_arrives_during_a_step_is_never_reported_waiting_when_it_is_taken_on_next():
    """Reported after the step's result but before the next plan, it would show as waiting for a moment, and the
    data-parallel router weighs a waiting request as four running ones (4 streams split 3 to 1 on a loaded machine)."""
    held = HeldLoop("arrive")
    held.add("a", max_tokens=8)
    held.thread.start()
    try:
        assert held.next_message().stats.num_running == 1  # "a" planned; its step is held
        held.add("b", max_tokens=2)
        threading.Event().wait(0.5)  # the loop, waiting for the held step, reads "b" meanwhile
        held.held.answer.set()
        reported, finished = [], set()
        while finished != {"a", "b"}:
            msg = held.next_message()
            reported.append((msg.stats.num_running, msg.stats.num_waiting))
            finished |= {out.req_id for out in msg.outputs if out.finish_reason}
        assert all(waiting == 0 for _, waiting in reported), reported
        assert (2, 0) in reported, reported  # "b" ran beside "a"
    finally:
        held.close()
