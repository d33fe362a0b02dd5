"""Continuous batching with chunked prefill over a paged KV cache (vLLM V1's model, pure logic).

Every request has num_computed_tokens chasing num_tokens; a step spends one token budget on closing
those gaps, running requests first (oldest first), then waiting ones in FIFO order. A prefill is just a
big gap, a decode a gap of 1, so both mix freely in one step and a long prompt is computed in chunks.

One step is in flight at a time: schedule() -> the worker runs the plan -> update_from_output().
"""
import bisect
import itertools
from collections import deque
from dataclasses import dataclass

from protocol.messages import FinishReason, RequestOutput, SchedulerStats, StepPlan, StepResult
from scheduler.block_manager import BlockManager
from scheduler.request import Request, RequestStatus
from scheduler.worker_view import WorkerView


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_blocks: int

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "num_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.block_manager = BlockManager(config.num_blocks, config.block_size)
        # The longest a request may grow. Besides max_model_len, the whole pool caps it, so that a request
        # alone always fits and preemption always ends; the newest token needs no slot until it is fed back.
        self.max_len = min(config.max_model_len, config.num_blocks * config.block_size + 1)
        self.requests: dict[str, Request] = {}  # every unfinished request, waiting or running
        self.waiting: deque[Request] = deque()  # preempted requests go back to the front
        self.running: list[Request] = []  # kept in arrival order: the tail is preempted first
        self._arrival_rank: dict[str, int] = {}
        self._next_rank = itertools.count()
        self._worker = WorkerView()
        self._pending_outputs: list[RequestOutput] = []
        self._step_id = 0
        self._in_flight: dict[str, tuple[Request, int]] | None = None  # the plan's requests and their token counts

    # ---- frontend side -----------------------------------------------------------------------------

    def add_request(self, req: Request) -> bool:
        """Queues req; False if it can never be served, with an ERROR output waiting in take_pending_outputs()."""
        error = self._admission_error(req)
        if error is not None:
            req.status, req.finish_reason = RequestStatus.FINISHED, FinishReason.ERROR
            self._pending_outputs.append(
                RequestOutput(req.req_id, [], FinishReason.ERROR, req.num_prompt_tokens, error=error))
            return False
        req.status = RequestStatus.WAITING
        self.requests[req.req_id] = req
        self._arrival_rank[req.req_id] = next(self._next_rank)
        self.waiting.append(req)
        return True

    def abort(self, req_ids: list[str]) -> None:
        """Ends the given requests now, freeing their blocks; each yields one ABORT output. Unknown ids are ignored."""
        for req_id in req_ids:
            req = self.requests.get(req_id)
            if req is None:
                continue
            if req.status is RequestStatus.WAITING:
                self.waiting.remove(req)
            else:
                self.running.remove(req)
            self._finish(req, FinishReason.ABORT)
            self._pending_outputs.append(RequestOutput(req_id, [], FinishReason.ABORT, req.num_prompt_tokens))

    def take_pending_outputs(self) -> list[RequestOutput]:
        """Outputs not produced by a step (rejections, aborts), to be sent to the frontend once."""
        outputs, self._pending_outputs = self._pending_outputs, []
        return outputs

    # ---- worker side -------------------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        """Plans the next step, or None when no request is unfinished."""
        if self._in_flight is not None:
            raise RuntimeError(f"step {self._step_id} is still in flight: call update_from_output() first")
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted = False

        index = 0
        while index < len(self.running) and budget > 0:
            req = self.running[index]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            assert num_new > 0, f"running request {req.req_id} has nothing to compute"
            while not self.block_manager.allocate(req, req.num_computed_tokens + num_new):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                break
            scheduled.append((req, num_new))
            budget -= num_new
            index += 1

        # After a preemption the pool is tight: admitting new work now would only be preempted next.
        while not preempted and self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            req = self.waiting[0]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self.block_manager.allocate(req, req.num_computed_tokens + num_new):
                break  # strict FIFO: a later, smaller request may not overtake
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            bisect.insort(self.running, req, key=lambda r: self._arrival_rank[r.req_id])
            scheduled.append((req, num_new))
            budget -= num_new

        if not scheduled:
            return None
        self._step_id += 1
        self._in_flight = {req.req_id: (req, num_new) for req, num_new in scheduled}
        return self._worker.make_plan(self._step_id, scheduled)

    def update_from_output(self, plan: StepPlan, result: StepResult) -> list[RequestOutput]:
        """Applies the worker's result for `plan`; returns one output per request that gained a token."""
        if self._in_flight is None or plan.step_id != self._step_id:
            raise ValueError(f"plan {plan.step_id} is not the step in flight")
        if result.step_id != plan.step_id or len(result.req_ids) != len(result.sampled_token_ids):
            raise ValueError(f"malformed result for step {plan.step_id}: {result}")
        in_flight, self._in_flight = self._in_flight, None
        for req, num_new in in_flight.values():
            if req.status is RequestStatus.RUNNING:  # else aborted while the step ran: nothing to update
                req.num_computed_tokens += num_new

        outputs = []
        for req_id, token_id in zip(result.req_ids, result.sampled_token_ids):
            req = in_flight.get(req_id, (None, 0))[0]
            if req is None or req.status is not RequestStatus.RUNNING or req.num_computed_tokens != req.num_tokens:
                continue
            req.output_token_ids.append(token_id)
            reason = req.stop_reason(self.max_len)
            if reason is not None:
                self._finish(req, reason)
            outputs.append(RequestOutput(req_id, [token_id], reason, req.num_prompt_tokens))

        # A request that caught up without a token would never be scheduled again: end it rather than hang.
        for req, _ in in_flight.values():
            if req.status is RequestStatus.RUNNING and req.num_computed_tokens == req.num_tokens:
                self._finish(req, FinishReason.ERROR)
                outputs.append(RequestOutput(req.req_id, [], FinishReason.ERROR, req.num_prompt_tokens,
                                             error="the worker returned no token for this request"))
        if any(req.status is RequestStatus.FINISHED for req, _ in in_flight.values()):
            self.running = [req for req in self.running if req.status is RequestStatus.RUNNING]
        return outputs

    # ---- state ---------------------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(self.num_running, self.num_waiting, self.block_manager.num_free_blocks,
                              self.block_manager.num_total_blocks, self._step_id)

    def check_invariants(self) -> None:
        """For tests: raises AssertionError if the queues, the worker view or the block pool disagree."""
        assert len(self.running) <= self.config.max_num_seqs
        ranks = [self._arrival_rank[req.req_id] for req in self.running]
        assert ranks == sorted(ranks), "running is out of arrival order"
        for req in self.waiting:
            assert req.status is RequestStatus.WAITING and not req.block_ids and req.num_computed_tokens == 0
        for req in self.running:
            assert req.status is RequestStatus.RUNNING
            assert len(req.block_ids) * self.config.block_size >= req.num_computed_tokens
        assert {id(r) for r in self.requests.values()} == {id(r) for r in [*self.running, *self.waiting]}
        assert len(self.requests) == len(self.running) + len(self.waiting), "a request is queued twice"
        assert self._worker.known_req_ids() <= {req.req_id for req in self.running}
        self.block_manager.check_invariants([*self.running, *self.waiting])

    # ---- internals -----------------------------------------------------------------------------------

    def _admission_error(self, req: Request) -> str | None:
        if req.req_id in self.requests:
            return f"request id {req.req_id!r} is already in use"
        if not req.prompt_token_ids:
            return "the prompt is empty"
        try:
            req.sampling.validate()
        except ValueError as e:
            return str(e)
        num_prompt = req.num_prompt_tokens
        if num_prompt >= self.config.max_model_len:
            return (f"the prompt has {num_prompt} tokens but max_model_len is {self.config.max_model_len}, "
                    f"which leaves no room to generate")
        num_blocks = self.block_manager.blocks_for_tokens(num_prompt)
        if num_blocks > self.block_manager.num_total_blocks:
            return (f"the prompt needs {num_blocks} KV cache blocks of {self.config.block_size} tokens "
                    f"but the cache only has {self.block_manager.num_total_blocks}")
        return None

    def _preempt(self, req: Request) -> None:
        """Frees req's blocks and requeues it at the front; it will be recomputed over prompt + outputs so far."""
        self.block_manager.free(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        self._worker.forget(req.req_id)

    def _finish(self, req: Request, reason: str) -> None:
        """Ends req and frees its blocks; the caller takes it out of waiting/running."""
        self.block_manager.free(req)
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
        del self.requests[req.req_id]
        del self._arrival_rank[req.req_id]
        self._worker.forget(req.req_id)
