"""A deterministic stand-in for a model worker that checks every StepPlan it is given.

It keeps what a real worker keeps (each request's tokens and block table) and a fake KV cache: each
slot records (req_id, position, token) when written. Before "attending" it checks that every earlier
position of the request is still there, so a block handed to two live requests, a block table that
lost a block, or a recompute that skipped positions all fail loudly. The sampled token is a pure
function of (req_id, position), so outputs do not depend on batching, chunking or preemption.
"""
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol.messages import StepPlan, StepResult
from protocol.sampling import SamplingParams
from scheduler.request import Request
from scheduler.scheduler import Scheduler, SchedulerConfig

EOS = 2
VOCAB = 1000

TokenFn = Callable[[str, int], int]


def default_token_fn(req_id: str, position: int) -> int:
    """Never EOS: tokens start at 10."""
    return 10 + zlib.crc32(f"{req_id}:{position}".encode()) % VOCAB


def eos_at(positions: dict[str, int], base: TokenFn = default_token_fn) -> TokenFn:
    """Samples EOS for req_id when the new token lands at positions[req_id]."""
    return lambda req_id, pos: EOS if positions.get(req_id) == pos else base(req_id, pos)


@dataclass(slots=True)
class WorkerRequest:
    token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int = 0


@dataclass
class FakeWorker:
    num_blocks: int
    block_size: int
    token_fn: TokenFn = default_token_fn
    reqs: dict[str, WorkerRequest] = field(default_factory=dict)
    step_id: int = 0
    # Tokens a request had when it was dropped: if it comes back (resumed after preemption) it must match.
    dropped_tokens: dict[str, list[int]] = field(default_factory=dict)
    num_scheduled_per_step: list[int] = field(default_factory=list)
    num_reqs_per_step: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kv: list[tuple[str, int, int] | None] = [None] * (self.num_blocks * self.block_size)

    def execute(self, plan: StepPlan) -> StepResult:
        assert plan.step_id == self.step_id + 1, f"step {plan.step_id} after {self.step_id}"
        self.step_id = plan.step_id
        for req_id in plan.finished_req_ids:
            assert req_id in self.reqs, f"finished {req_id} was never sent"
            self.dropped_tokens[req_id] = self.reqs.pop(req_id).token_ids

        scheduled: list[tuple[str, int]] = []
        for new in plan.new_reqs:
            assert new.req_id not in self.reqs, f"{new.req_id} sent as new but the worker holds it"
            if new.req_id in self.dropped_tokens:
                assert new.prompt_token_ids == self.dropped_tokens[new.req_id], f"{new.req_id} resumed with other tokens"
            assert new.num_computed_tokens == 0, "no prefix caching yet: a new request starts from scratch"
            self.reqs[new.req_id] = WorkerRequest(list(new.prompt_token_ids), list(new.block_ids))
            scheduled.append((new.req_id, new.num_scheduled_tokens))
        for cached in plan.cached_reqs:
            assert cached.req_id in self.reqs, f"{cached.req_id} sent as cached but the worker does not hold it"
            req = self.reqs[cached.req_id]
            assert cached.num_computed_tokens == req.num_computed_tokens, (
                f"{cached.req_id}: scheduler says {cached.num_computed_tokens} computed, worker has {req.num_computed_tokens}")
            req.block_ids.extend(cached.new_block_ids)
            scheduled.append((cached.req_id, cached.num_scheduled_tokens))
        assert len({req_id for req_id, _ in scheduled}) == len(scheduled), "a request scheduled twice"
        self._check_blocks_disjoint()

        self.num_scheduled_per_step.append(sum(n for _, n in scheduled))
        self.num_reqs_per_step.append(len(scheduled))
        sampled_req_ids, sampled = [], []
        for req_id, num_scheduled in scheduled:
            token = self._run(req_id, num_scheduled)
            if token is not None:
                sampled_req_ids.append(req_id)
                sampled.append(token)
        return StepResult(plan.step_id, 0, sampled_req_ids, sampled)

    def _run(self, req_id: str, num_scheduled: int) -> int | None:
        req = self.reqs[req_id]
        start, end = req.num_computed_tokens, req.num_computed_tokens + num_scheduled
        assert num_scheduled >= 1 and end <= len(req.token_ids), f"{req_id}: bad range [{start}, {end})"
        assert len(req.block_ids) * self.block_size >= end, f"{req_id}: blocks do not cover position {end - 1}"
        for pos in range(start, end):
            self.kv[self._slot(req, pos)] = (req_id, pos, req.token_ids[pos])
        for pos in range(end):  # attention reads every earlier position
            assert self.kv[self._slot(req, pos)] == (req_id, pos, req.token_ids[pos]), f"{req_id}: KV at {pos} lost"
        req.num_computed_tokens = end
        if end < len(req.token_ids):
            return None  # a prefill chunk short of the end samples nothing
        token = self.token_fn(req_id, end)
        req.token_ids.append(token)
        return token

    def _slot(self, req: WorkerRequest, pos: int) -> int:
        return req.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size

    def _check_blocks_disjoint(self) -> None:
        owner: dict[int, str] = {}
        for req_id, req in self.reqs.items():
            for block_id in req.block_ids:
                assert 0 <= block_id < self.num_blocks, f"{req_id}: block {block_id} out of range"
                assert block_id not in owner, f"block {block_id} held by {owner[block_id]} and {req_id}"
                owner[block_id] = req_id


def run_to_completion(scheduler, worker: FakeWorker, max_steps: int = 100_000,
                      on_step: Callable[[int], None] | None = None) -> dict[str, list]:
    """Steps until nothing is unfinished, checking invariants after every step; returns outputs per request."""
    outputs: dict[str, list] = {}
    for out in scheduler.take_pending_outputs():
        outputs.setdefault(out.req_id, []).append(out)
    for step in range(max_steps):
        plan = scheduler.schedule()
        if plan is None:
            assert not scheduler.has_unfinished(), "unfinished requests but nothing scheduled"
            return outputs
        for out in scheduler.update_from_output(plan, worker.execute(plan)):
            outputs.setdefault(out.req_id, []).append(out)
        scheduler.check_invariants()
        if on_step is not None:
            on_step(step)
        for out in scheduler.take_pending_outputs():
            outputs.setdefault(out.req_id, []).append(out)
    raise AssertionError(f"not done after {max_steps} steps")


def tokens_of(outputs: list) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def make_request(req_id: str, prompt_len: int, max_tokens: int = 16, arrival_time: float = 0.0,
                 eos_token_ids: tuple[int, ...] = (EOS,), **sampling) -> Request:
    prompt = [100 + (zlib.crc32(req_id.encode()) + i) % VOCAB for i in range(prompt_len)]
    return Request(req_id, prompt, SamplingParams(max_tokens=max_tokens, **sampling), list(eos_token_ids), arrival_time)


def make_scheduler(max_num_seqs: int = 8, max_num_batched_tokens: int = 64, max_model_len: int = 128,
                   block_size: int = 4, num_blocks: int = 64,
                   token_fn: TokenFn = default_token_fn) -> tuple[Scheduler, FakeWorker]:
    config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len, block_size, num_blocks)
    return Scheduler(config), FakeWorker(num_blocks, block_size, token_fn)


def step(scheduler: Scheduler, worker: FakeWorker):
    """One schedule -> execute -> update round; returns (plan, outputs by req_id)."""
    plan = scheduler.schedule()
    assert plan is not None
    outputs = scheduler.update_from_output(plan, worker.execute(plan))
    scheduler.check_invariants()
    return plan, {out.req_id: out for out in outputs}
