"""The scheduler's consistency checks, for tests (called after every step by the fake-worker tests)."""
import itertools
from typing import TYPE_CHECKING

from tinyvllm.scheduler.async_scheduling import check_in_flight_request
from tinyvllm.scheduler.request import Request, RequestStatus

if TYPE_CHECKING:
    from tinyvllm.scheduler.scheduler import Scheduler


def check_scheduler_invariants(sched: "Scheduler") -> None:
    """Raises AssertionError if the queues, the worker view or the block pool disagree."""
    config = sched.config
    assert sum(sched.seats(req) for req in sched.running) <= config.max_num_seqs, "more seats taken than max_num_seqs"
    ranks = [sched.arrival_rank[req.req_id] for req in sched.running]
    assert ranks == sorted(ranks), "running is out of arrival order"
    kv = sched.kv_cache_manager
    for req in sched.waiting:  # a swapped-out request's slots hold the blocks of its computed tokens
        assert req.status is RequestStatus.WAITING and not req.block_ids
        assert len(req.swap_slots) == kv.blocks_for_tokens(req.num_computed_tokens), f"{req.req_id}: swap slots"
    for req in sched.running:
        assert req.status is RequestStatus.RUNNING
        assert len(req.block_ids) * config.block_size >= req.num_computed_tokens
    forking = [child for req in itertools.chain(sched.running, sched.waiting) for child in req.pending_forks]
    for child in forking:
        assert child.status is RequestStatus.WAITING_FOR_FORK and not child.block_ids and not child.pending_forks
    loading = sched.remote_kv.loading
    for req in loading:
        assert req.status is RequestStatus.WAITING_FOR_REMOTE_KV and req.block_ids and req.num_computed_tokens == 0
    queued = [*sched.running, *sched.waiting, *forking, *loading]
    assert {id(r) for r in sched.requests.values()} == {id(r) for r in queued}
    assert len(sched.requests) == len(queued), "a request is queued twice"
    for parent_id, children in sched.groups.items():
        assert any(not child.is_finished for child in children), f"group {parent_id} outlived its children"
    sched.steps_in_flight.check_invariants(sched.stats().step_id)
    running = {id(req) for req in sched.running}
    in_flight: dict[Request, list[int]] = {}
    for req, num_new in sched.steps_in_flight.requests():
        if not req.is_finished:  # else finished or aborted while in flight: its results will be ignored
            in_flight.setdefault(req, []).append(num_new)
    for req, steps in in_flight.items():
        assert id(req) in running, f"{req.req_id} is in a step in flight but not running"
        assert sched.worker_view.knows(req.req_id), f"{req.req_id} is in flight but the workers dropped it"
        steps[-1] -= len(req.draft_token_ids)  # the drafts of its newest step go past its known tokens
        check_in_flight_request(req, steps, config.async_scheduling, config.block_size)
    sched.worker_view.check_invariants(sched.running)
    kv.check_invariants(queued, [*sched.remote_kv.leases.block_tables(), *sched.disk_kv.block_tables()])
    assert not any(req.swap_slots for req in queued if req.status is not RequestStatus.WAITING), "swap slots held"
    sched.swap.check_invariants(queued)
