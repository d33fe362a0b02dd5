"""SchedulerLoop over real frontend sockets, with a stand-in for the workers: it keeps up to max_steps_in_flight
plans sent, takes the results in order and only from the rank that samples, and streams the same tokens."""
import threading

import pytest
import zmq

from fake_worker import FakeWorker, make_request, make_scheduler, run_to_completion, tokens_of
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.messages import Shutdown, StepOutputs, StepPlan, StepResult
from tinyvllm.protocol.process_args import SchedulerArgs
from tinyvllm.protocol.transport import Endpoints, make_socket, recv, send
from tinyvllm.scheduler.main import SchedulerLoop
from tinyvllm.scheduler.request import Request


class StubWorkers:
    """WorkerGroup after its handshake, two ranks of which rank 1 samples: a plan runs on the fake worker when it
    is sent; rank 0's empty acknowledgement, then rank 1's result, wait on a socket the loop polls."""
    output_rank = 1

    def __init__(self, ctx: zmq.Context, worker: FakeWorker):
        self.worker = worker
        self.sock = make_socket(ctx, zmq.PULL, "inproc://stub-workers", bind=True)
        self._results = make_socket(ctx, zmq.PUSH, "inproc://stub-workers", bind=False)
        self.num_sent = self.num_answered = self.most_outstanding = 0

    def broadcast(self, msg, skip_gone: bool = False) -> None:
        if isinstance(msg, StepPlan):
            self.num_sent += 1
            self.most_outstanding = max(self.most_outstanding, self.num_sent - self.num_answered)
            result = self.worker.execute(msg)
            send(self._results, StepResult(msg.step_id, 0, [], []))
            result.rank = 1
            send(self._results, result)

    def recv(self, deadline: float):
        msg = recv(self.sock)
        self.num_answered += msg.rank == self.output_rank
        return b"", msg


def prompts() -> list[Request]:
    # A budget of 6 tokens splits the two 6-token prompts into steps of their own: two groups that take turns.
    return [make_request(name, 6, max_tokens=5) for name in ("a", "b")]


# two workers either way (rank 1 samples): two tensor-parallel ranks keep one step in flight, two pipeline stages two
@pytest.mark.parametrize("tp, pp, steps_in_flight", [(2, 1, 1), (1, 2, 2)])
def test_the_loop_keeps_steps_in_flight_and_reads_the_sampling_rank(tp, pp, steps_in_flight, tmp_path):
    sched, worker = make_scheduler(max_num_batched_tokens=6, max_steps_in_flight=steps_in_flight)
    endpoints = Endpoints.ipc(str(tmp_path))
    args = SchedulerArgs(EngineConfig.of(tensor_parallel_size=tp, pipeline_parallel_size=pp, block_size=4,
                                         max_num_seqs=8, max_num_batched_tokens=6, num_kv_blocks=64, max_model_len=128))
    assert args.engine.max_steps_in_flight == steps_in_flight and not args.engine.runs_async
    frontend_ctx = zmq.Context()
    from_scheduler = make_socket(frontend_ctx, zmq.PULL, endpoints.frontend_output, bind=True)
    loop = SchedulerLoop(endpoints, args)
    to_scheduler = make_socket(frontend_ctx, zmq.PUSH, endpoints.scheduler_input, bind=False)
    loop.workers, loop.scheduler = StubWorkers(loop.ctx, worker), sched
    assert sched.config.max_steps_in_flight == args.engine.max_steps_in_flight
    for req in prompts():
        sched.add_request(req)
    thread = threading.Thread(target=loop.loop, daemon=True)
    thread.start()
    outputs: dict[str, list] = {}
    try:
        while len([o for outs in outputs.values() for o in outs if o.finish_reason]) < 2:
            assert from_scheduler.poll(10_000), "no StepOutputs"
            msg = recv(from_scheduler)
            assert isinstance(msg, StepOutputs)
            for out in msg.outputs:
                outputs.setdefault(out.req_id, []).append(out)
        send(to_scheduler, Shutdown("done"))
        thread.join(10)
        assert not thread.is_alive()
    finally:
        loop.ctx.destroy(linger=0)
        frontend_ctx.destroy(linger=0)
    assert loop.workers.most_outstanding == steps_in_flight
    reference_sched, reference_worker = make_scheduler()
    for req in prompts():
        reference_sched.add_request(req)
    expected = run_to_completion(reference_sched, reference_worker)
    assert {k: tokens_of(v) for k, v in outputs.items()} == {k: tokens_of(v) for k, v in expected.items()}


def test_a_shutdown_skips_a_worker_that_is_gone_and_still_reaches_the_others():
    from tinyvllm.scheduler.worker_group import WorkerGroup
    ctx = zmq.Context()
    try:
        router = make_socket(ctx, zmq.ROUTER, "inproc://workers-some-gone", bind=True)
        alive = make_socket(ctx, zmq.DEALER, "inproc://workers-some-gone", bind=False, identity=b"worker-1")
        group = WorkerGroup(router, secret="")
        group.identities = {0: b"worker-0", 1: b"worker-1"}  # rank 0 was killed: nothing routes to it any more
        alive.send(b"hello")  # the router learns the live worker's identity
        assert router.poll(2000) and router.recv_multipart()[0] == b"worker-1"
        with pytest.raises(zmq.ZMQError):
            group.broadcast(Shutdown("stop"))
        group.broadcast(Shutdown("stop"), skip_gone=True)
        assert alive.poll(2000) and isinstance(recv(alive), Shutdown)
    finally:
        ctx.destroy(linger=0)
