"""The frontend's handle on the scheduler: send AddRequest/AbortRequests, fan StepOutputs out per request.

One asyncio task reads the scheduler's output socket and puts each request's deltas on its own queue,
so detokenization (done by whoever consumes generate()) overlaps the next engine step. Another watches the
engine: when one of its processes exits, or it owes outputs and no step has finished within the step timeout (a
hung worker or scheduler), every open request ends with an error. The HTTP server and the offline `LLM` (through a
background event loop, and frontend/engine/engine_pool.py's replicas) speak to an engine only through this class.
"""
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

import zmq
import zmq.asyncio

from tinyvllm.frontend.engine.request_completion import RequestCompletion
from tinyvllm.protocol.messages import (AbortRequests, AddRequest, EngineReady, ErrorKind, FinishReason, RequestOutput,
                                        SchedulerStats, Shutdown, StepOutputs)
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.protocol.codec import encode
from tinyvllm.protocol.transport import make_socket, recv_async, send_async

log = logging.getLogger("tinyvllm.engine_client")
PROCESS_POLL_S = 0.5  # how often the engine's processes are checked for one that exited


class EngineDeadError(RuntimeError):
    pass


class RequestQueues:
    """Each open request's queue of outputs, and generate()'s side of it: the request's entry, its outputs until it
    is complete or fails, the abort when its consumer leaves early, and failing every open request at once.
    EngineClient fills the queues from the scheduler's outputs; the tests' fake engine (tests/frontend/fake_engine.py)
    from steps it makes up, so the two cannot differ in how a request is served."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue] = {}
        self.dead_reason: str | None = None

    async def _submit(self, req: AddRequest) -> None:
        """Hands a new request (its queue already open) to the engine."""
        raise NotImplementedError

    def _forget(self, req_id: str) -> None:
        """The request's generate() ended, however it did."""

    def abort(self, req_ids: list[str]) -> None:
        raise NotImplementedError

    def mark_dead(self, reason: str) -> None:
        """Called when a child process died: every open request ends with an error, new ones are refused."""
        self.dead_reason = reason
        self.fail_open_requests(reason)

    def fail_open_requests(self, reason: str, kind: str = ErrorKind.UNAVAILABLE) -> None:
        """Ends every open request with an ERROR output at once (generate() then aborts it in a live scheduler)."""
        for req_id, q in self.queues.items():
            q.put_nowait(RequestOutput(req_id, [], FinishReason.ERROR, error=reason, error_kind=kind))

    async def generate(self, req_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                       eos_token_ids: list[int]) -> AsyncIterator[RequestOutput]:
        """Yields this request's deltas (with n > 1, every child's, told apart by RequestOutput.index) until
        every child has finished or one output is an ERROR. Leaving early aborts the request."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        if req_id in self.queues:
            raise ValueError(f"duplicate request id {req_id}")
        q: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.queues[req_id] = q
        completion = RequestCompletion(sampling.n)
        try:
            await self._submit(AddRequest(req_id, list(prompt_token_ids), sampling, list(eos_token_ids), time.time()))
            while not completion.done:
                if q.empty():
                    out = await q.get()
                else:  # getting a queued output does not yield: let the other streams and requests run in between
                    await asyncio.sleep(0)
                    out = q.get_nowait()
                completion.observe(out)
                yield out
        finally:
            del self.queues[req_id]
            self._forget(req_id)
            if not completion.all_children_finished and self.dead_reason is None:
                self.abort([req_id])  # a parent id aborts every child still running


class EngineClient(RequestQueues):
    def __init__(self, scheduler_input: str, frontend_output: str, name: str = "engine",
                 step_timeout_s: float | None = None):
        """name: what error messages call this engine (e.g. "engine 1" among replicas); step_timeout_s: how long
        the engine may owe outputs without finishing a step before it counts as hung (None: forever)."""
        super().__init__()
        self.name, self.step_timeout_s = name, step_timeout_s
        self.ctx = zmq.asyncio.Context()
        self.to_scheduler = make_socket(self.ctx, zmq.PUSH, scheduler_input, bind=False)
        self.from_scheduler = make_socket(self.ctx, zmq.PULL, frontend_output, bind=True)
        self._owed: dict[str, RequestCompletion] = {}  # requests the scheduler has not finished yet
        self._last_progress = time.monotonic()  # the last step's outputs, or a request reaching an idle engine
        self.stats = SchedulerStats()
        self.ready: EngineReady | None = None
        self._ready_event = asyncio.Event()
        self._reader: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._closed = False

    async def start(self, timeout_s: float = 600.0,
                    dead_process: Callable[[], str | None] | None = None) -> EngineReady:
        """Waits for the scheduler's EngineReady. `dead_process` (EngineProcesses.dead_process) names a child
        that exited, or None while all run: one that exits before ready fails the start at once, and one that
        exits later fails every open request (mark_dead)."""
        self._reader = asyncio.create_task(self._read_outputs())
        deadline = time.monotonic() + timeout_s
        while not self._ready_event.is_set():
            if dead_process is not None and (dead := dead_process()) is not None:
                self.mark_dead(f"{self.name} failed to start: {dead}")
                break
            if (left := deadline - time.monotonic()) <= 0:
                raise TimeoutError("engine did not start in time")
            with contextlib.suppress(TimeoutError):  # (not wait_for: in 3.11 it may swallow a cancel)
                async with asyncio.timeout(min(left, PROCESS_POLL_S) if dead_process else left):
                    await self._ready_event.wait()
        if self.ready is None:
            raise EngineDeadError(self.dead_reason or "engine did not start")
        if dead_process is not None:
            self._watcher = asyncio.create_task(self._watch(dead_process))
        return self.ready

    async def _watch(self, dead_process: Callable[[], str | None]) -> None:
        stalled_checks = 0
        while (dead := dead_process()) is None:
            # Seen stalled twice in a row: the reader has had a turn in between, so outputs are not just unread.
            stalled_checks = stalled_checks + 1 if self._stalled() else 0
            if stalled_checks == 2:
                reason = f"{self.name} stopped answering: no step finished within {self.step_timeout_s:g} s"
                break
            await asyncio.sleep(PROCESS_POLL_S)
        else:
            reason = f"{self.name} process died ({dead})"
        log.error("%s; failing open requests", reason)
        self.mark_dead(reason)

    def _stalled(self) -> bool:
        return (self.step_timeout_s is not None and bool(self._owed)
                and time.monotonic() - self._last_progress > self.step_timeout_s)

    async def _read_outputs(self) -> None:
        """Fans outputs out until the client closes; if that fails (a bug, or a message from the scheduler it cannot
        read, which may have held some request's last output), the engine counts as dead: its requests end with an
        error and its supervisor restarts it, rather than any request waiting forever."""
        try:
            await self._fan_out_outputs()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("%s: reading its outputs failed", self.name)
            self.mark_dead(f"{self.name}: reading its outputs failed ({e!r})")

    async def _fan_out_outputs(self) -> None:
        while True:
            msg = await recv_async(self.from_scheduler)  # CodecError: a message it cannot read (_read_outputs)
            if isinstance(msg, EngineReady):
                self.ready = msg
                self._ready_event.set()
            elif isinstance(msg, StepOutputs):
                self.stats, self._last_progress = msg.stats, time.monotonic()
                for out in msg.outputs:
                    if (q := self.queues.get(out.req_id)) is not None:
                        q.put_nowait(out)
                    if (owed := self._owed.get(out.req_id)) is not None:
                        owed.observe(out)
                        if owed.done:
                            del self._owed[out.req_id]
            # pyzmq's recv() hands back an already-finished future while messages wait, and awaiting one does not
            # yield: where they pile up (a frontend short of CPU), this loop would hold the event loop until the
            # engine had sent every token of every stream, and /metrics and the dashboard would wait behind it.
            await asyncio.sleep(0)

    def mark_dead(self, reason: str) -> None:
        super().mark_dead(reason)
        self._ready_event.set()  # a start() still waiting fails at once

    async def _submit(self, req: AddRequest) -> None:
        if not self._owed:
            self._last_progress = time.monotonic()  # an idle engine owes nothing yet for the time before
        self._owed[req.req_id] = RequestCompletion(req.sampling.n)
        await send_async(self.to_scheduler, req)

    def _forget(self, req_id: str) -> None:
        self._owed.pop(req_id, None)

    def abort(self, req_ids: list[str]) -> None:
        # Not a coroutine: it must work from a generator's finally during cancellation.
        self.to_scheduler.send(encode(AbortRequests(list(req_ids))), copy=False)

    async def close(self) -> None:
        """Asks the scheduler (and through it the workers) to stop, then closes the sockets. Only the first call
        does anything."""
        if self._closed:
            return
        self._closed = True
        for task in (self._reader, self._watcher):
            if task is not None:
                task.cancel()
        try:
            await asyncio.wait_for(send_async(self.to_scheduler, Shutdown("frontend stopping")), 1.0)
        except (asyncio.TimeoutError, zmq.ZMQError):
            pass
        self.to_scheduler.close(linger=500)  # let the Shutdown leave before the socket goes
        self.from_scheduler.close(linger=0)
        self.ctx.term()
