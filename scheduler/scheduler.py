"""Continuous batching with chunked prefill over a paged KV cache (vLLM V1's model, pure logic).

Every request has num_computed_tokens chasing num_tokens; a step spends one token budget on closing
those gaps, running requests first (oldest first), then waiting ones in FIFO order. A prefill is just a
big gap, a decode a gap of 1, so both mix freely in one step and a long prompt is computed in chunks.
A request being admitted (or resumed after preemption) starts past the longest cached prefix of its tokens, or
where it was if it was swapped out (swap.py).

Up to max_steps_in_flight planned steps are outstanding (steps_in_flight.py), their results taken in plan
order (update_from_output); a request in one of them is not preempted, nor planned again until its result is in
unless async scheduling (async_scheduling.py) lets it go on where its steps in flight end.
"""
import bisect
import itertools
import time
from collections import deque

from tinyvllm.protocol.messages import ErrorKind, FinishReason, RequestOutput, SchedulerStats, StepPlan, StepResult
from tinyvllm.scheduler.admission import admission_error
from tinyvllm.scheduler.async_scheduling import tokens_to_plan
from tinyvllm.scheduler.config import SchedulerConfig
from tinyvllm.scheduler.disk_kv import DiskKV
from tinyvllm.scheduler.kv_cache_manager import KVCacheManager
from tinyvllm.scheduler.parallel_sampling import child_id, make_children
from tinyvllm.scheduler.preemption import choose_victim
from tinyvllm.scheduler.remote_kv import RemoteKV
from tinyvllm.scheduler.request import Request, RequestStatus
from tinyvllm.scheduler.request_outputs import request_output, sampled_output, well_formed
from tinyvllm.scheduler.spec_decode import SpecDecode
from tinyvllm.scheduler.stats_report import running_summaries
from tinyvllm.scheduler.steps_in_flight import Step, StepsInFlight
from tinyvllm.scheduler.swap import SwapSpace
from tinyvllm.scheduler.worker_view import WorkerView


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.kv_cache_manager = KVCacheManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
        # The longest a request may grow. Besides max_model_len, the whole pool caps it, so that a request
        # alone always fits and preemption always ends; the newest token needs no slot until it is fed back.
        self.max_len = min(config.max_model_len, config.num_blocks * config.block_size + 1
                           if config.blocks_per_request is None else config.max_model_len)
        self.requests: dict[str, Request] = {}  # every unfinished request by its own id (children: "parent#i")
        self.groups: dict[str, list[Request]] = {}  # parent id -> its children, while any is unfinished (n > 1)
        self.waiting: deque[Request] = deque()  # preempted requests go back to the front
        self.running: list[Request] = []  # kept in arrival order: the tail is preempted first
        self.arrival_rank: dict[str, int] = {}
        self._next_rank = itertools.count()
        self.worker_view = WorkerView()
        self._pending_outputs: list[RequestOutput] = []
        self._step_id = 0
        self.steps_in_flight = StepsInFlight(config.max_steps_in_flight)
        self.prefix_cache_queries = self.prefix_cache_hits = self.num_preemptions = self.num_tokens_computed = 0
        self.swap = SwapSpace(config.num_swap_slots, config.swap_min_tokens)
        self.remote_kv = RemoteKV(self.kv_cache_manager, config.kv_lease_s, config.world_size)
        self.disk_kv = DiskKV(self.kv_cache_manager)  # off until opened (--kv-cache-dir)
        self.spec = SpecDecode(config.speculative)  # drafts for decoding requests (--speculative-config)

    # ---- frontend side -----------------------------------------------------------------------------

    def add_request(self, req: Request) -> bool:
        """Queues req (n > 1: its children); False if it can never be served, with one ERROR output (index 0)
        waiting in take_pending_outputs()."""
        c = self.config
        error = (admission_error(req, self.requests.keys() | self.groups.keys(), c.max_model_len, c.block_size,
                                 c.num_blocks, c.blocks_per_request)
                 or self.remote_kv.admission_error(req)
                 or (f"LoRA adapter '{req.sampling.lora.name}': this server runs no adapters (serve --enable-lora)"
                     if req.sampling.lora is not None and not c.max_loras else None))
        if error is not None:
            self.remote_kv.refused(req)
            req.status, req.finish_reason = RequestStatus.FINISHED, FinishReason.ERROR
            self._pending_outputs.append(request_output(req, [], FinishReason.ERROR, error, ErrorKind.INVALID_REQUEST))
            return False
        children = [req] if req.sampling.n == 1 else make_children(req)
        if req.sampling.n > 1:
            self.groups[req.req_id] = children
        for child in children:
            self.requests[child.req_id] = child
            self.arrival_rank[child.req_id] = next(self._next_rank)
            if child.status is RequestStatus.WAITING:  # the rest wait for their leader to fork
                self.waiting.append(child)
        return True

    def abort(self, req_ids: list[str]) -> None:
        """Ends the given requests now (a parent id: all its children), freeing their blocks; each unfinished
        request yields one ABORT output. Unknown ids are ignored."""
        for req_id in req_ids:
            targets = self.groups.get(req_id) or [self.requests.get(req_id)]
            for req in targets:
                if req is None or req.is_finished:
                    continue
                self._unqueue(req)
                self._finish(req, FinishReason.ABORT)
                self._pending_outputs.append(request_output(req, [], FinishReason.ABORT))

    def end_with_error(self, output: RequestOutput, error: str) -> RequestOutput:
        """The ERROR output that replaces `output` (one the frontend cannot be sent); its request (child
        output.index of a parallel-sampling parent) ends now if it is still unfinished, freeing its blocks."""
        req_id = child_id(output.req_id, output.index) if output.req_id in self.groups else output.req_id
        if (req := self.requests.get(req_id)) is not None:
            self._unqueue(req)
            self._finish(req, FinishReason.ERROR)
        failed = RequestOutput(output.req_id, [], FinishReason.ERROR, output.num_prompt_tokens,
                               output.num_cached_tokens, error, output.index)
        failed.queue_time_s, failed.error_kind = output.queue_time_s, ErrorKind.INVALID_REQUEST  # asked too much
        return failed

    def take_pending_outputs(self) -> list[RequestOutput]:
        """Outputs not produced by a step (rejections, aborts), to be sent to the frontend once."""
        outputs, self._pending_outputs = self._pending_outputs, []
        return outputs

    # ---- worker side -------------------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        """Plans the next step from the requests in no step in flight, or None when there is nothing to plan."""
        if self.steps_in_flight.is_full():
            raise RuntimeError(f"{len(self.steps_in_flight)} steps are in flight: call update_from_output() first")
        kv = self.kv_cache_manager
        self.remote_kv.expire_leases()
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preemptions_before = self.num_preemptions

        # Copy-on-write first for requests the workers have not seen (fresh forks), so the last holder of a
        # shared block writes in place and no table the workers hold ever needs a block replaced.
        for req in list(self.running):
            if req.status is RequestStatus.RUNNING and not self.worker_view.knows(req.req_id):
                if not self._allocate_or_preempt(req, req.num_computed_tokens) and req.status is RequestStatus.RUNNING:
                    return None  # it still shares a block its leader may write next: plan nothing until it has a copy

        index, stalled = 0, False
        while index < len(self.running) and budget > 0:
            req = self.running[index]
            index += 1  # victims of preemption are newer than req: the requests after it
            start = req.num_computed_tokens + self.steps_in_flight.num_tokens(req)
            num_new = tokens_to_plan(req, start, budget, self.steps_in_flight, self.config.async_scheduling,
                                     self.max_len)
            if num_new == 0:
                assert self.steps_in_flight.holds(req), f"running request {req.req_id} has nothing to compute"
                continue
            num_new = self.spec.plan_drafts(req, start, num_new, budget, self.max_len,
                                            self.worker_view.knows(req.req_id) and not self.steps_in_flight.holds(req))
            if not self._allocate_or_preempt(req, self.spec.slots_for(req, start + num_new, self.max_len)):
                stalled = True  # req preempted itself (it was the newest), or waits for a step in flight (its own)
                break
            scheduled.append((req, start, num_new))
            budget -= num_new

        # After a preemption the pool is tight: admitting new work now would only be preempted next.
        seats_taken = sum(self.seats(req) for req in self.running) + len(self.remote_kv.loading)
        adapters = {req.sampling.lora.key for req in self.running if req.sampling.lora is not None}
        no_slot: list[Request] = []  # requests of adapters no slot is left for, in order: they go back after
        while not stalled and self.num_preemptions == preemptions_before and self.waiting and budget > 0:
            req = self.waiting[0]
            lora = req.sampling.lora
            if lora is not None and lora.key not in adapters and (no_slot or len(adapters) >= self.config.max_loras):
                no_slot.append(self.waiting.popleft())  # the ones behind it that need no new slot may go first
                continue
            if self.remote_kv.needs_load(req):  # disaggregated decode: its prompt's KV is pulled, not computed
                if seats_taken + 1 > self.config.max_num_seqs or not self.remote_kv.start_load(req):
                    break
                self.waiting.popleft()
                seats_taken += 1
                continue
            if (start := self._admission_start(req)) is None:
                break  # its prefix goes on on disk: that is loaded first
            cached_block_ids, num_cached = start
            if req.pending_forks and num_cached >= req.num_prompt_tokens - 1:
                self._release_forks(req, at=1)  # the cache holds the shared prompt: each child looks it up itself
            if seats_taken + self.seats(req) > self.config.max_num_seqs:
                break
            num_new = min(req.compute_limit - num_cached, budget)
            if not kv.admit(req, cached_block_ids, self.spec.slots_for(req, num_cached + num_new, self.max_len)):
                break  # strict FIFO: a later, smaller request may not overtake
            self.waiting.popleft()
            if req.swap_slots:
                self.swap.swap_in(req)
            elif kv.enable_caching and not req.needs_every_position:  # those never look the cache up
                self.prefix_cache_queries += req.num_tokens
                self.prefix_cache_hits += num_cached
            req.status, req.num_computed_tokens = RequestStatus.RUNNING, num_cached
            if req.num_cached_tokens is None:
                req.num_cached_tokens = num_cached
            if req.queue_time_s is None and req.arrival_time > 0:
                req.queue_time_s = max(0.0, time.time() - req.arrival_time)
            self._insert_running(req)
            if lora is not None:
                adapters.add(lora.key)
            seats_taken += self.seats(req)
            scheduled.append((req, num_cached, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(no_slot))

        kv_loads = self.remote_kv.take_new_loads()
        disk_work = self.disk_kv.take_work(self._step_id + 1)
        if not scheduled and not kv_loads and not any(disk_work):
            return None
        self._step_id += 1
        self.steps_in_flight.add(self._step_id, [(req, num_new) for req, _, num_new in scheduled])
        plan = self.worker_view.make_plan(self._step_id, scheduled, kv.take_block_copies())
        plan.kv_loads, (plan.kv_disk_saves, plan.kv_disk_deletes, plan.kv_disk_loads) = kv_loads, disk_work
        plan.swap_out, plan.swap_in = self.swap.take_plan_lists()
        self.remote_kv.add_leases(plan, scheduled)
        return plan

    def update_from_output(self, plan: StepPlan, result: StepResult) -> list[RequestOutput]:
        """Applies the worker's result for `plan`, the oldest step in flight (else ValueError); returns one output
        per request that gained a token."""
        step = self.steps_in_flight.oldest(plan.step_id)
        if not well_formed(result, plan.step_id):
            raise ValueError(f"malformed result for step {plan.step_id}: {result}")
        self.steps_in_flight.pop_oldest()
        return self._apply_step_result(step, result) + self._apply_kv_loads(result)

    # ---- a step's result ---------------------------------------------------------------------------

    def _apply_step_result(self, step: Step, result: StepResult) -> list[RequestOutput]:
        """Applies `result`, the worker's answer to `step` (already taken off the steps in flight); returns one output
        per request that gained a token or an embedding, or ended.

        The requests' computed tokens advance (their full blocks enter the prefix cache, a leader that reached its fork
        point forks), sampled tokens are appended and checked for a stop. With speculative decoding a request's news is
        the drafts the worker accepted, then its sampled token (_append_until_stop). A request that finished or was
        aborted while the step was in flight is skipped: with async scheduling that includes a step planned for a token
        that turned out to end the request, whose result for it is discarded."""
        self.disk_kv.apply(result)  # blocks filled from disk enter the prefix cache before anything is freed
        kv, window = self.kv_cache_manager, self.config.sliding_window
        outputs = []
        for req_id, reason in zip(result.failed_req_ids, result.failed_reasons):
            if (req := step.get(req_id, (None, 0))[0]) is not None and req.status is RequestStatus.RUNNING:
                self._finish(req, FinishReason.ERROR)  # before its blocks count as computed: the worker skipped it
                outputs.append(request_output(req, [], FinishReason.ERROR, reason, ErrorKind.INVALID_REQUEST))
        for req, num_new in step.values():
            if req.status is RequestStatus.RUNNING:
                num_new -= len(req.draft_token_ids)  # the drafts count as their tokens are appended (below)
                req.num_computed_tokens += num_new
                self.num_tokens_computed += num_new
                kv.cache_computed_blocks(req)
                if window and not (req.kv_transfer and req.kv_transfer.do_remote_decode):
                    kv.free_behind_window(req, window)  # a prefill's are leased
                if req.pending_forks and req.num_computed_tokens == req.num_prompt_tokens - 1:
                    self._fork(req)

        def caught_up(req_id: str) -> Request | None:
            req = step.get(req_id, (None, 0))[0]
            ok = req is not None and req.status is RequestStatus.RUNNING and req.num_computed_tokens == req.num_tokens
            return req if ok else None

        for row, (req_id, token_id) in enumerate(zip(result.req_ids, result.sampled_token_ids)):
            if (req := caught_up(req_id)) is None:
                continue
            accepted = self.spec.take_accepted(req, result.accepted_draft_ids[row] if result.accepted_draft_ids else [])
            new_tokens = self._append_until_stop(req, accepted + [token_id])
            self.spec.keep_proposals(req, result.proposed_draft_ids, row)
            reason = req.stop_reason(self.max_len)
            if reason is not None:
                self._finish(req, reason)
            elif accepted:
                kv.cache_computed_blocks(req)
            outputs.append(sampled_output(req, reason, result, row, new_tokens))
        for req_id, embedding in zip(result.pooled_req_ids, result.embeddings):
            if (req := caught_up(req_id)) is not None:  # an embedding request is done once its prompt is
                self._finish(req, FinishReason.STOP)
                out = request_output(req, [], FinishReason.STOP)
                out.embedding = embedding
                outputs.append(out)

        # A request that caught up without a token would never be scheduled again: end it rather than hang.
        for req, _ in step.values():
            if req.status is RequestStatus.RUNNING and req.num_computed_tokens == req.num_tokens:
                self._finish(req, FinishReason.ERROR)
                outputs.append(request_output(req, [], FinishReason.ERROR,
                                              "the worker returned no token for this request"))
        if any(req.status is RequestStatus.FINISHED for req, _ in step.values()):
            self.running = [req for req in self.running if req.status is RequestStatus.RUNNING]
        return outputs

    def _append_until_stop(self, req: Request, token_ids: list[int]) -> list[int]:
        """Appends token_ids (accepted drafts, then the sampled token) up to the first that stops req; each but the
        last had its KV computed by the step (the rejected drafts' did not count). Returns those appended."""
        for i, token_id in enumerate(token_ids):
            req.output_token_ids.append(token_id)
            if i < len(token_ids) - 1:
                req.num_computed_tokens += 1
                self.num_tokens_computed += 1
            if req.stop_reason(self.max_len) is not None:
                return token_ids[:i + 1]
        return token_ids

    def _apply_kv_loads(self, result: StepResult) -> list[RequestOutput]:
        """The requests whose prompt's KV arrived from a prefill instance run; those whose pull failed end."""
        arrived, failed = self.remote_kv.take_loaded(result)
        for req in arrived:
            self._insert_running(req)
        outputs = []
        for req, reason in failed:
            self._finish(req, FinishReason.ERROR)
            outputs.append(request_output(req, [], FinishReason.ERROR, f"pulling the prompt's KV failed: {reason}",
                                          ErrorKind.ENGINE_FAILURE))
        return outputs

    # ---- state ---------------------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Queued requests, counting parallel-sampling children that wait for their leader to fork and requests
        whose KV is being pulled from a prefill instance."""
        return (len(self.waiting) + len(self.remote_kv.loading)  # those wait for their prompt's KV
                + sum(len(req.pending_forks) for req in itertools.chain(self.running, self.waiting)))

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def stats(self) -> SchedulerStats:
        """Counts, cumulative counters and the running batch's summary, reported with every step."""
        kv, swap = self.kv_cache_manager, self.swap
        stats = SchedulerStats(
            self.num_running, self.num_waiting, kv.num_free_blocks, kv.num_total_blocks, self._step_id,
            self.prefix_cache_queries, self.prefix_cache_hits, self.num_preemptions, self.num_tokens_computed,
            swap.num_free_slots, swap.num_slots, swap.num_swapped_out_blocks, swap.num_swapped_in_blocks,
            num_cached_free_blocks=kv.pool.num_cached_free_blocks, running_requests=running_summaries(self.running))
        if self.config.max_loras:
            stats.max_loras = self.config.max_loras
            stats.running_lora_adapters, stats.waiting_lora_adapters = (
                sorted({r.sampling.lora.name for r in reqs if r.sampling.lora is not None})
                for reqs in (self.running, self.waiting))
        return self.spec.add_stats(stats)

    def seats(self, req: Request) -> int:
        """max_num_seqs slots a request takes: a leader reserves seats for the siblings that will fork from it."""
        return min(1 + len(req.pending_forks), self.config.max_num_seqs)

    # ---- internals -----------------------------------------------------------------------------------

    def _allocate_or_preempt(self, req: Request, num_total_tokens: int) -> bool:
        """Makes room for req's next tokens, preempting the newest running requests as needed; False if that
        preempted req itself, or if only requests in flight could make room (req stays running and waits)."""
        # A block table the workers hold may only grow: copy-on-write is for requests they have not seen yet.
        may_copy = not self.worker_view.knows(req.req_id)
        while not self.kv_cache_manager.allocate_slots(req, num_total_tokens, may_copy):
            victim = choose_victim(req, self.running, self.steps_in_flight)
            if victim is None:
                return False
            self.running.remove(victim)
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        """Frees req's blocks and requeues it at the front (the caller took it out of running). Swapped out
        (swap.py), it resumes where it was once its slots are copied back; else it resumes through the prefix cache
        and recomputes the rest of prompt + outputs so far."""
        self.remote_kv.preempted(req)
        kv = self.kv_cache_manager
        if self.swap.should_swap(req, kv):
            self.swap.swap_out(req, kv)
        else:
            req.num_computed_tokens = 0
        kv.free(req)
        req.status, req.draft_token_ids = RequestStatus.WAITING, []  # drafts of a step it was not planned in
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        self.worker_view.forget(req.req_id)

    def _admission_start(self, req: Request) -> tuple[list[int], int] | None:
        """(the cached blocks req starts with, its tokens they hold): where it was if it was swapped out, else past
        its longest cached prefix. None: its prefix goes on in the persistent prefix cache, which loads it first
        (disk_kv.py)."""
        if req.swap_slots:
            return [], req.num_computed_tokens
        kv, window = self.kv_cache_manager, self.config.sliding_window
        cached_block_ids = kv.find_cached_prefix(req)
        if self.disk_kv.holds_back(req, cached_block_ids):
            return None
        num_cached = len(cached_block_ids) * self.config.block_size
        return (kv.behind_window(cached_block_ids, window) if window else cached_block_ids), num_cached

    def _fork(self, leader: Request) -> None:
        """The leader computed all but the last prompt token: its siblings take its blocks and run beside it,
        in the seats reserved for them; any beyond max_num_seqs wait (and find the prompt in the cache)."""
        num_seated = self.seats(leader) - 1
        children, leader.pending_forks = leader.pending_forks, []
        for child in children[:num_seated]:
            self.kv_cache_manager.fork(leader, child)
            child.status, child.num_computed_tokens = RequestStatus.RUNNING, leader.num_computed_tokens
            child.num_cached_tokens = leader.num_cached_tokens
            self._insert_running(child)
        self._requeue(children[num_seated:], at=0)

    def _release_forks(self, leader: Request, at: int) -> None:
        """The leader's siblings become independent waiting requests, at waiting[at:]."""
        children, leader.pending_forks = leader.pending_forks, []
        self._requeue(children, at)

    def _requeue(self, reqs: list[Request], at: int) -> None:
        for req in reversed(reqs):
            req.status = RequestStatus.WAITING
            self.waiting.insert(at, req)

    def _insert_running(self, req: Request) -> None:
        bisect.insort(self.running, req, key=lambda r: self.arrival_rank[r.req_id])

    def _unqueue(self, req: Request) -> None:
        if req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        elif req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING_FOR_REMOTE_KV:
            self.remote_kv.loading.remove(req)
        else:
            leader = next(r for r in self.groups[req.parent_id] if req in r.pending_forks)
            leader.pending_forks.remove(req)

    def _finish(self, req: Request, reason: str) -> None:
        """Ends req and frees its blocks; the caller takes it out of waiting/running."""
        if req.pending_forks:  # only on abort: the siblings have not forked yet and go on without the leader
            self._release_forks(req, at=0)
        self.remote_kv.free_or_lease(req, reason)
        self.swap.release(req)
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
        del self.requests[req.req_id]
        del self.arrival_rank[req.req_id]
        self.worker_view.forget(req.req_id)
        if req.parent_id is not None and all(child.is_finished for child in self.groups[req.parent_id]):
            del self.groups[req.parent_id]
