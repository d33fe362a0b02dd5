"""A deterministic stand-in for a model worker that checks every StepPlan it is given.

It keeps what a real worker keeps (each request's tokens and block table) and a fake KV cache: a written slot
records (position, prefix hash, writer), the prefix hash standing for every token up to and including that
position, which is exactly what real keys and values depend on. Before "attending", a request checks that every
position up to its newest holds what its own token history would have written: a block handed to two live
requests, a lost block, a wrong cache hit, a skipped recompute or a missed copy all fail loudly, while a prefix
shared with another request (cache hit, fork) legitimately passes. The plan's block copies are performed first
(between its swap-outs and swap-ins: fake_host_swap.py), and writing into a block that another request the worker
holds also holds fails (copy-on-write must have happened). The worker learns its sampled tokens from the next plan
that schedules the request (with async scheduling it appends its newest one itself where the plan says
append_sampled): exactly those, never one twice. A sampled token is a pure function of the request and its
position (token_fn), or of the row's contents and sampling parameters (sample_fn), so outputs do not depend on
batching, chunking, caching or preemption.
"""
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from fake_host_swap import FakeHostSwap
from fake_requests import make_prompt, make_request, step  # noqa: F401 (re-exported for the tests)
from fake_disk import FakeDisk
from fake_tokens import (EOS, VOCAB, SampleFn, TokenFn, content_sample_fn, default_token_fn,  # noqa: F401
                         eos_at, with_random_eos)
from invariants import check_scheduler_invariants
from tinyvllm.protocol.messages import StepPlan, StepResult
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.protocol.speculative_config import SpeculativeConfig, may_draft
from tinyvllm.scheduler.config import SchedulerConfig
from tinyvllm.scheduler.scheduler import Scheduler

POOLED = -1  # _run's answer for an embedding request that computed its whole prompt


def fake_embedding(token_ids: list[int]) -> list[float]:
    """An embedding request's "vector": a pure function of its prompt."""
    return [float(len(token_ids)), float(sum(token_ids) % 997)]


def prefix_hashes(token_ids: list[int], hashes: list[int] | None = None) -> list[int]:
    """hashes[p] stands for token_ids[:p + 1]; extends `hashes` in place to cover every token."""
    hashes = [] if hashes is None else hashes
    for token in token_ids[len(hashes):]:
        hashes.append(hash((hashes[-1] if hashes else 0, token)))
    return hashes


@dataclass(slots=True)
class WorkerRequest:
    token_ids: list[int]
    block_ids: list[int]
    sampling: SamplingParams
    num_computed_tokens: int = 0
    prefix_hashes: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)  # accepted drafts and sampled, not yet brought back by a plan
    drafts: list[int] = field(default_factory=list)  # speculative decoding: this step's, after token_ids


@dataclass
class FakeWorker:
    num_blocks: int
    block_size: int
    token_fn: TokenFn = default_token_fn
    sample_fn: SampleFn | None = None  # when set, used instead of token_fn
    reqs: dict[str, WorkerRequest] = field(default_factory=dict)
    step_id: int = 0
    # Tokens a request had when it was dropped: if it comes back (resumed after preemption) it must match.
    dropped_tokens: dict[str, list[int]] = field(default_factory=dict)
    num_scheduled_per_step: list[int] = field(default_factory=list)
    num_reqs_per_step: list[int] = field(default_factory=list)
    num_computed_by_req: Counter = field(default_factory=Counter)  # tokens each request id had computed, in total
    num_block_copies: int = 0
    kv_source: "FakeWorker | None" = None  # disaggregated decode: the prefill worker that plan.kv_loads pull from
    window: int = 0  # a sliding window: a position attends to the last `window` positions only (0: all)
    disk: FakeDisk = field(default_factory=FakeDisk)  # the persistent prefix cache's files
    # A draft model (speculative "draft_model"): after each sampled row that may speculate, propose up to draft_k
    # tokens (the newest, repeated), checking that the row's blocks hold the slots those forwards would write.
    draft_k: int = 0
    max_model_len: int = 0

    def __post_init__(self) -> None:
        self.kv: list[tuple[int, int, str] | None] = [None] * (self.num_blocks * self.block_size)
        self.leases: dict[str, list[int]] = {}  # what a prefill worker's side channel would serve
        self.host_swap = FakeHostSwap(self.block_size, self.num_blocks)

    def execute(self, plan: StepPlan) -> StepResult:
        assert plan.step_id == self.step_id + 1, f"step {plan.step_id} after {self.step_id}"
        self.step_id = plan.step_id
        self.disk.before_step(self.kv, self.block_size, plan)
        for req_id in plan.finished_req_ids:
            assert req_id in self.reqs, f"finished {req_id} was never sent"
            dropped = self.reqs.pop(req_id)
            self.dropped_tokens[req_id] = dropped.token_ids + dropped.sampled

        scheduled: list[tuple[str, int]] = []
        for new in plan.new_reqs:
            assert new.req_id not in self.reqs, f"{new.req_id} sent as new but the worker holds it"
            if new.req_id in self.dropped_tokens:
                assert new.prompt_token_ids == self.dropped_tokens[new.req_id], f"{new.req_id} resumed with other tokens"
            assert 0 <= new.num_computed_tokens < len(new.prompt_token_ids)
            self.reqs[new.req_id] = WorkerRequest(list(new.prompt_token_ids), list(new.block_ids), new.sampling,
                                                  new.num_computed_tokens)
            scheduled.append((new.req_id, new.num_scheduled_tokens))
        for cached in plan.cached_reqs:
            assert cached.req_id in self.reqs, f"{cached.req_id} sent as cached but the worker does not hold it"
            req = self.reqs[cached.req_id]
            assert cached.num_computed_tokens == req.num_computed_tokens, (
                f"{cached.req_id}: scheduler says {cached.num_computed_tokens} computed, worker has {req.num_computed_tokens}")
            req.block_ids.extend(cached.new_block_ids)
            # Async scheduling: the worker appends its own newest sampled token (a placeholder in the scheduler).
            brought = cached.new_token_ids + (req.sampled[-1:] if cached.append_sampled else [])
            assert req.sampled[-1:] or not cached.append_sampled, f"{cached.req_id}: nothing sampled to append"
            assert brought == req.sampled, (
                f"{cached.req_id}: the plan brings tokens {brought}, the worker sampled {req.sampled}")
            req.token_ids += req.sampled + cached.draft_token_ids
            req.sampled, req.drafts = [], list(cached.draft_token_ids)
            scheduled.append((cached.req_id, cached.num_scheduled_tokens))
        assert len({req_id for req_id, _ in scheduled}) == len(scheduled), "a request scheduled twice"
        for req_id in plan.kv_leases_ended:
            self.leases.pop(req_id, None)
        self.leases.update((lease.req_id, (lease.block_ids, lease.tokens_hash)) for lease in plan.kv_leases)
        self.host_swap.swap_out(self.kv, plan.swap_out)
        self._copy_blocks(plan.block_copies)
        self.host_swap.swap_in(self.kv, plan.swap_in)
        loaded, failed = self._load_remote(plan)

        holders = self._holders()
        self.num_scheduled_per_step.append(sum(n for _, n in scheduled))
        self.num_reqs_per_step.append(len(scheduled))
        result = StepResult(plan.step_id, 0, [], [])
        result.kv_loaded_req_ids, result.kv_failed_req_ids = loaded, list(failed)
        result.kv_failed_reasons = list(failed.values())
        for req_id, num_scheduled in scheduled:
            self.num_computed_by_req[req_id] += num_scheduled
            token = self._run(req_id, num_scheduled, holders)
            if token is None:
                continue
            if token == POOLED:
                result.pooled_req_ids.append(req_id)
                result.embeddings.append(fake_embedding(self.reqs[req_id].token_ids))
            else:
                result.req_ids.append(req_id)
                result.sampled_token_ids.append(token)
                result.accepted_draft_ids.append(self.reqs[req_id].sampled[:-1])
                result.proposed_draft_ids.append(self._propose(req_id))
        if not any(result.accepted_draft_ids):
            result.accepted_draft_ids = []
        if not any(result.proposed_draft_ids):
            result.proposed_draft_ids = []
        self.disk.after_step(self.kv, self.block_size, plan, result, {b for b, reqs in holders.items() if reqs})
        return result

    def _load_remote(self, plan: StepPlan) -> tuple[list[str], dict[str, str]]:
        """Copies each load's remote blocks (the kv_source's slots) into its local blocks."""
        loaded, failed, bs = [], {}, self.block_size
        for load in plan.kv_loads:
            if self.kv_source is None:
                failed[load.req_id] = "no prefill worker"
                continue
            if self.kv_source.leases.get(load.remote.remote_request_id) != (load.remote.remote_block_ids,
                                                                            load.tokens_hash):
                failed[load.req_id] = "no lease"
                continue
            for src, dst in zip(load.remote.remote_block_ids, load.local_block_ids, strict=True):
                self.kv[dst * bs:(dst + 1) * bs] = self.kv_source.kv[src * bs:(src + 1) * bs]
            loaded.append(load.req_id)
        return loaded, failed

    def _copy_blocks(self, pairs: list[list[int]]) -> None:
        bs = self.block_size
        for src, dst in pairs:
            assert src != dst and 0 <= src < self.num_blocks and 0 <= dst < self.num_blocks, f"bad copy {src} -> {dst}"
            self.kv[dst * bs:(dst + 1) * bs] = self.kv[src * bs:(src + 1) * bs]
            self.num_block_copies += 1

    def _first_visible(self, position: int) -> int:
        return max(0, position - self.window + 1) if self.window else 0

    def _holders(self) -> dict[int, set[str]]:
        """Who holds each block: every block of a request's table that its next tokens can still see."""
        holders: dict[int, set[str]] = defaultdict(set)
        for req_id, req in self.reqs.items():
            live = req.block_ids[self._first_visible(req.num_computed_tokens) // self.block_size:]
            assert len(set(live)) == len(live), f"{req_id} holds a block twice"
            for block_id in live:
                assert 0 <= block_id < self.num_blocks, f"{req_id}: block {block_id} out of range"
                holders[block_id].add(req_id)
        return holders

    def _run(self, req_id: str, num_scheduled: int, holders: dict[int, set[str]]) -> int | None:
        req = self.reqs[req_id]
        start, end = req.num_computed_tokens, req.num_computed_tokens + num_scheduled
        assert num_scheduled >= 1 and end <= len(req.token_ids), f"{req_id}: bad range [{start}, {end})"
        assert len(req.block_ids) * self.block_size >= end, f"{req_id}: blocks do not cover position {end - 1}"
        hashes = prefix_hashes(req.token_ids, req.prefix_hashes)
        for block_index in range(start // self.block_size, (end - 1) // self.block_size + 1):
            block_id = req.block_ids[block_index]
            assert holders[block_id] == {req_id}, f"{req_id} writes block {block_id}, shared with {holders[block_id]}"
            leased_to = {other for other, (blocks, _) in self.leases.items() if block_id in blocks} - {req_id}
            assert not leased_to, f"{req_id} writes block {block_id}, leased to {leased_to}"
        for pos in range(start, end):
            self.kv[self._slot(req, pos)] = (pos, hashes[pos], req_id)
        for pos in range(self._first_visible(start), end):  # attention reads every earlier position (in the window)
            slot = self.kv[self._slot(req, pos)]
            assert slot is not None and slot[:2] == (pos, hashes[pos]), (
                f"{req_id}: KV at position {pos} is not its own history (written by {slot and slot[2]})")
        req.num_computed_tokens = end
        assert not req.sampled, f"{req_id} scheduled before its sampled token came back"
        if end < len(req.token_ids):
            return None  # a prefill chunk short of the end samples nothing
        if req.sampling.embed:
            return POOLED

        def target(pos: int) -> int:  # the token the model samples at pos, given the tokens before it
            if self.sample_fn is not None:
                return self.sample_fn(req_id, pos, hashes[pos - 1], req.sampling)
            return self.token_fn(req_id, pos)

        # Speculative decoding: drafts are accepted while each is the token the model samples there; the rejected
        # ones leave token_ids, and their positions count as not computed.
        real, accepted = end - len(req.drafts), []
        for draft in req.drafts:
            if target(real + len(accepted)) != draft:
                break
            accepted.append(draft)
        req.sampled = accepted + [target(real + len(accepted))]  # like a real worker: learnt from the next plan
        del req.token_ids[real:], req.prefix_hashes[real:]
        req.num_computed_tokens, req.drafts = real + len(accepted), []
        return req.sampled[-1]

    def _propose(self, req_id: str) -> list[int]:
        req = self.reqs[req_id]
        if not self.draft_k or not may_draft(req.sampling):
            return []
        newest = req.num_computed_tokens  # the newest token's position: the proposals' forwards write from there
        n = min(self.draft_k, self.max_model_len - 1 - newest)
        assert n <= 0 or len(req.block_ids) * self.block_size >= newest + n, (
            f"{req_id}: no lookahead slots for positions {newest}..{newest + n - 1}: {len(req.block_ids)} blocks")
        return [req.sampled[-1]] * max(n, 0)

    def _slot(self, req: WorkerRequest, pos: int) -> int:
        return req.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size


def run_to_completion(scheduler, worker: FakeWorker, max_steps: int = 100_000,
                      on_step: Callable[[int], None] | None = None) -> dict[str, list]:
    """Steps until nothing is unfinished, checking invariants after every step; returns outputs per request id
    (the parent's id for parallel-sampling children: see by_index)."""
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
        check_scheduler_invariants(scheduler)
        if on_step is not None:
            on_step(step)
        for out in scheduler.take_pending_outputs():
            outputs.setdefault(out.req_id, []).append(out)
    raise AssertionError(f"not done after {max_steps} steps")


def tokens_of(outputs: list) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def by_index(outputs: list) -> dict[int, list]:
    """A parent's outputs split per child index."""
    split: dict[int, list] = {}
    for out in outputs:
        split.setdefault(out.index, []).append(out)
    return split


def make_scheduler(max_num_seqs: int = 8, max_num_batched_tokens: int = 64, max_model_len: int = 128,
                   block_size: int = 4, num_blocks: int = 64, token_fn: TokenFn = default_token_fn,
                   enable_prefix_caching: bool = True, sample_fn: SampleFn | None = None,
                   max_steps_in_flight: int = 1, async_scheduling: bool = False, num_swap_slots: int = 0,
                   swap_min_tokens: int = 1, sliding_window: int = 0,
                   speculative: SpeculativeConfig | None = None, max_loras: int = 0) -> tuple[Scheduler, FakeWorker]:
    config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len, block_size, num_blocks,
                             enable_prefix_caching, max_steps_in_flight, async_scheduling,
                             num_swap_slots=num_swap_slots, swap_min_tokens=swap_min_tokens,
                             sliding_window=sliding_window, speculative=speculative, max_loras=max_loras)
    draft_k = speculative.num_speculative_tokens if speculative and speculative.method == "draft_model" else 0
    scheduler = Scheduler(config)
    return scheduler, FakeWorker(num_blocks, block_size, token_fn, sample_fn, window=sliding_window, draft_k=draft_k,
                                 max_model_len=scheduler.max_len)
