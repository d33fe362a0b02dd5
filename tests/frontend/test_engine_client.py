"""EngineClient against a scripted scheduler on real ZMQ sockets: generate with parallel sampling, the processes it
watches dying, and an engine that stops finishing steps."""
import asyncio

import pytest
import zmq
import zmq.asyncio

from tinyvllm.frontend.engine import engine_client as engine_client_module
from tinyvllm.frontend.engine.engine_client import EngineClient, EngineDeadError
from tinyvllm.protocol.messages import (AbortRequests, AddRequest, EngineReady, FinishReason, RequestOutput, SchedulerStats,
                               StepOutputs)
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.protocol.transport import Endpoints, make_socket, recv_async, send_async

pytestmark = pytest.mark.anyio


class ScriptedScheduler:
    def __init__(self, endpoints: Endpoints):
        self.ctx = zmq.asyncio.Context()
        self.inbox = make_socket(self.ctx, zmq.PULL, endpoints.scheduler_input, bind=True)
        self.outbox = make_socket(self.ctx, zmq.PUSH, endpoints.frontend_output, bind=False)

    async def receive(self, timeout_s: float = 2.0):
        return await asyncio.wait_for(recv_async(self.inbox), timeout_s)

    async def step(self, *outputs: RequestOutput) -> None:
        await send_async(self.outbox, StepOutputs(list(outputs), SchedulerStats()))

    def close(self) -> None:
        self.ctx.destroy(linger=0)


@pytest.fixture
async def engine_and_scheduler(tmp_path):
    endpoints = Endpoints.ipc(str(tmp_path))
    scheduler = ScriptedScheduler(endpoints)
    client = EngineClient(endpoints.scheduler_input, endpoints.frontend_output)
    await send_async(scheduler.outbox, EngineReady(16, 16, 256, 8, 1))
    await client.start(5)
    yield client, scheduler
    await client.close()
    scheduler.close()


def out(index: int, tokens: list[int], finish: str | None = None, error: str | None = None) -> RequestOutput:
    return RequestOutput("r", tokens, finish, 2, 0, error, index)


async def _consume(client: EngineClient, n: int, received: list, stop_after: int | None = None,
                   arrived: asyncio.Queue | None = None) -> None:
    gen = client.generate("r", [5, 6], SamplingParams(n=n), [2])
    async for o in gen:
        received.append(o)
        if arrived is not None:
            arrived.put_nowait(o)
        if stop_after is not None and len(received) == stop_after:
            await gen.aclose()
            return


async def test_generate_ends_only_when_every_child_finished(engine_and_scheduler):
    client, scheduler = engine_and_scheduler
    received, arrived = [], asyncio.Queue()
    consumer = asyncio.create_task(_consume(client, 3, received, arrived=arrived))
    add = await scheduler.receive()
    assert isinstance(add, AddRequest) and add.sampling.n == 3
    await scheduler.step(out(0, [7]), out(1, [8]), out(2, [9], FinishReason.STOP))
    await scheduler.step(out(0, [7], FinishReason.LENGTH), out(1, [8]))
    for _ in range(5):
        await asyncio.wait_for(arrived.get(), 2)
    assert not consumer.done()  # child 1 still runs (a consumer that ended would have done so by now)
    await scheduler.step(out(1, [8], FinishReason.STOP))
    await asyncio.wait_for(consumer, 2)
    assert [(o.index, o.finish_reason) for o in received] == [
        (0, None), (1, None), (2, "stop"), (0, "length"), (1, None), (1, "stop")]
    client.abort(["marker"])
    assert await scheduler.receive() == AbortRequests(["marker"])  # finished normally: no abort came before it
    assert client.queues == {}


async def test_an_error_ends_the_whole_request(engine_and_scheduler):
    client, scheduler = engine_and_scheduler
    received = []
    consumer = asyncio.create_task(_consume(client, 3, received))
    await scheduler.receive()
    await scheduler.step(out(0, [7]), out(1, [], FinishReason.ERROR, "no token"))
    await asyncio.wait_for(consumer, 2)
    assert [o.finish_reason for o in received] == [None, "error"]
    abort = await scheduler.receive()  # the other children may still be running
    assert abort == AbortRequests(["r"])


async def test_leaving_early_aborts_the_parent(engine_and_scheduler):
    client, scheduler = engine_and_scheduler
    received = []
    consumer = asyncio.create_task(_consume(client, 2, received, stop_after=2))
    await scheduler.receive()
    await scheduler.step(out(0, [7], FinishReason.STOP), out(1, [8]))
    await asyncio.wait_for(consumer, 2)
    assert await scheduler.receive() == AbortRequests(["r"])


class ExitingProcesses:
    def __init__(self):
        self.exited = False

    def dead_process(self) -> str | None:
        return "tinyvllm-scheduler exited with code 1" if self.exited else None


async def test_a_process_exiting_before_ready_fails_the_start(tmp_path):
    endpoints = Endpoints.ipc(str(tmp_path))
    client, procs = EngineClient(endpoints.scheduler_input, endpoints.frontend_output), ExitingProcesses()
    procs.exited = True
    with pytest.raises(EngineDeadError, match="failed to start: tinyvllm-scheduler exited"):
        await client.start(5, procs.dead_process)
    await client.close()


async def test_a_process_exiting_later_fails_open_and_new_requests(tmp_path):
    endpoints = Endpoints.ipc(str(tmp_path))
    scheduler, procs = ScriptedScheduler(endpoints), ExitingProcesses()
    client = EngineClient(endpoints.scheduler_input, endpoints.frontend_output)
    await send_async(scheduler.outbox, EngineReady(16, 16, 256, 8, 1))
    try:
        await client.start(5, procs.dead_process)
        received = []
        consumer = asyncio.create_task(_consume(client, 1, received))
        await scheduler.receive()
        procs.exited = True
        await asyncio.wait_for(consumer, 5)
        assert [(o.finish_reason, o.error) for o in received] == [
            ("error", "engine process died (tinyvllm-scheduler exited with code 1)")]
        with pytest.raises(EngineDeadError):
            await anext(client.generate("s", [5], SamplingParams(), [2]))
    finally:
        await client.close()
        scheduler.close()


@pytest.fixture
def fast_watch(monkeypatch):
    monkeypatch.setattr(engine_client_module, "PROCESS_POLL_S", 0.02)


async def started_client(endpoints: Endpoints, step_timeout_s: float) -> tuple[EngineClient, ScriptedScheduler]:
    scheduler = ScriptedScheduler(endpoints)
    client = EngineClient(endpoints.scheduler_input, endpoints.frontend_output, "engine 1", step_timeout_s)
    await send_async(scheduler.outbox, EngineReady(16, 16, 256, 8, 1))
    await client.start(5, ExitingProcesses().dead_process)
    return client, scheduler


async def test_an_engine_that_finishes_no_step_within_the_step_timeout_fails_its_requests(tmp_path, fast_watch):
    client, scheduler = await started_client(Endpoints.ipc(str(tmp_path)), step_timeout_s=0.2)
    try:
        received = []
        consumer = asyncio.create_task(_consume(client, 1, received))
        await scheduler.receive()
        await scheduler.step(out(0, [7]))  # one step, then silence (a hung worker or scheduler)
        await asyncio.wait_for(consumer, 5)
        assert [(o.finish_reason, o.error) for o in received] == [
            (None, None), ("error", "engine 1 stopped answering: no step finished within 0.2 s")]
        with pytest.raises(EngineDeadError, match="stopped answering"):
            await anext(client.generate("s", [5], SamplingParams(), [2]))
    finally:
        await client.close()
        scheduler.close()


async def test_an_idle_engine_or_a_slow_reader_is_not_a_hung_engine(tmp_path, fast_watch):
    client, scheduler = await started_client(Endpoints.ipc(str(tmp_path)), step_timeout_s=0.2)
    try:
        await asyncio.sleep(0.5)  # nothing asked of it
        outputs = client.generate("r", [5, 6], SamplingParams(), [2])
        first = asyncio.create_task(anext(outputs))
        await scheduler.receive()
        await scheduler.step(out(0, [7]), out(0, [8], FinishReason.STOP))
        assert (await first).new_token_ids == [7]
        await asyncio.sleep(0.5)  # the engine finished the request; its reader is just slow
        assert client.dead_reason is None
        assert [o.new_token_ids async for o in outputs] == [[8]]
    finally:
        await client.close()
        scheduler.close()


async def test_an_output_reader_that_fails_ends_every_open_request_with_an_error_instead_of_a_hang(
        engine_and_scheduler):
    client, scheduler = engine_and_scheduler

    class BrokenLedger(dict):  # what only the reader reads: its bookkeeping of what the engine owes
        def get(self, key, default=None):
            raise KeyError("a bug in the reader")

    received = []
    consumer = asyncio.create_task(_consume(client, 1, received))
    await scheduler.receive()
    client._owed = BrokenLedger(client._owed)
    await scheduler.step(out(0, [7]))
    await asyncio.wait_for(consumer, 5)
    assert received[-1].finish_reason == "error" and received[-1].error_kind == "unavailable"
    assert "reading its outputs failed" in received[-1].error and "a bug in the reader" in client.dead_reason
    with pytest.raises(EngineDeadError):
        await anext(client.generate("s", [5], SamplingParams(), [2]))


async def test_a_message_from_the_scheduler_it_cannot_read_fails_the_engine_rather_than_losing_an_output(
        engine_and_scheduler):
    client, scheduler = engine_and_scheduler
    received = []
    consumer = asyncio.create_task(_consume(client, 1, received))
    await scheduler.receive()
    await scheduler.outbox.send(b"\x93not a message")  # it may have held this request's last output
    await asyncio.wait_for(consumer, 5)
    assert received[-1].finish_reason == "error" and "reading its outputs failed" in client.dead_reason


async def test_a_backlog_of_outputs_leaves_the_event_loop_free_in_between(engine_and_scheduler):
    """Where outputs pile up (an engine that outruns a frontend short of CPU), the reader hands them out one message
    at a time, the event loop free in between, and each stream takes its queued outputs in turns with the others:
    nothing waits until the whole backlog is through (/metrics and the dashboard were unanswered for 40 s)."""
    client, scheduler = engine_and_scheduler
    n, order, backlog_at_first = 30, [], {}

    async def consume(req_id: str) -> None:
        async for o in client.generate(req_id, [5], SamplingParams(max_tokens=n), [2]):
            backlog_at_first.setdefault(req_id, sum(q.qsize() for q in client.queues.values()))
            order.append(req_id)

    tasks = [asyncio.create_task(consume(r)) for r in ("a", "b")]
    for _ in tasks:
        assert isinstance(await scheduler.receive(), AddRequest)
    for i in range(n):  # sent at once: they wait in the socket together
        finish = FinishReason.LENGTH if i == n - 1 else None
        await scheduler.step(RequestOutput("a", [i], finish, 1, 0), RequestOutput("b", [i], finish, 1, 0))
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert max(backlog_at_first.values()) <= 4, backlog_at_first  # not every message read before anyone ran
    assert len(order) == 2 * n

    tasks = [asyncio.create_task(consume(r)) for r in ("c", "d")]
    for _ in tasks:
        await scheduler.receive()
    for req_id in ("c", "d"):  # a backlog in the queues themselves
        for i in range(n):
            client.queues[req_id].put_nowait(RequestOutput(req_id, [i], FinishReason.LENGTH if i == n - 1 else None,
                                                           1, 0))
    order.clear()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert "d" in order[:n // 2] and "c" in order[:n // 2], order  # turns, not one stream's whole backlog first
