"""The scheduler's consistency checks, called by the tests after every step of the fake worker. They read the
objects' private state: what they check is exactly what the public methods keep hidden."""
import itertools
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tinyvllm.scheduler.block_pool import BlockPool
from tinyvllm.scheduler.kv_cache_manager import FREED, KVCacheManager, held_blocks
from tinyvllm.scheduler.request import Request, RequestStatus
from tinyvllm.scheduler.steps_in_flight import StepsInFlight
from tinyvllm.scheduler.swap import SwapSpace
from tinyvllm.scheduler.worker_view import WorkerView

if TYPE_CHECKING:
    from tinyvllm.scheduler.scheduler import Scheduler


def check_in_flight_request(req: Request, steps: list[int], async_scheduling: bool, block_size: int) -> None:
    """req's steps in flight (the tokens of each, oldest first) follow one another, only the last may
    compute a token not known yet, and req's blocks hold them all."""
    assert len(steps) == 1 or async_scheduling, f"{req.req_id} is in {len(steps)} steps in flight"
    start = req.num_computed_tokens
    for i, num_new in enumerate(steps):
        if start + num_new > req.num_tokens:
            assert async_scheduling and start == req.num_tokens and num_new == 1 and i == len(steps) - 1, (
                f"{req.req_id}: step {i} in flight computes [{start}, {start + num_new}) of {req.num_tokens} tokens")
        start += num_new
    assert len(req.block_ids) * block_size >= start, f"{req.req_id}: the blocks of its steps in flight were taken"


def free_block_ids(pool: BlockPool) -> list[int]:
    """The free queue, front (next to be evicted) first."""
    return list(pool._free)


def num_cached_blocks(pool: BlockPool) -> int:
    """Blocks registered in the prefix cache, held or free."""
    return sum(block.block_hash is not None for block in pool.blocks)


def check_block_pool(pool: BlockPool, block_tables: Iterable[list[int]]) -> None:
    """Raises AssertionError unless ref counts equal the number of tables holding each block (every holder's
    table must be given), the free queue holds exactly the unheld blocks, and the cache map is consistent."""
    tables = list(block_tables)
    for table in tables:
        assert len(set(table)) == len(table), f"a block table holds a block twice: {table}"
    held = Counter(itertools.chain.from_iterable(tables))
    for block_id in held:
        assert 0 <= block_id < pool.num_total_blocks, f"block id {block_id} out of range"
    for block in pool.blocks:
        if block.block_id in pool._free:
            assert block.ref_count == 0, f"free block {block.block_id} has ref_count {block.ref_count}"
            assert held[block.block_id] == 0, f"block {block.block_id} is free and held"
        else:
            assert block.ref_count > 0, f"block {block.block_id} is neither free nor held (leaked)"
            assert block.ref_count == held[block.block_id], (
                f"block {block.block_id}: ref_count {block.ref_count} but {held[block.block_id]} holders")
        if block.block_hash is not None:
            assert pool._cached.get(block.block_hash) is block, f"block {block.block_id}'s hash is not mapped to it"
    for block_hash, block in pool._cached.items():
        assert block.block_hash == block_hash, f"cache map entry points at block {block.block_id} with another hash"
    assert len(pool._free) + len(held) == pool.num_total_blocks, "free + held != total"
    assert pool.num_cached_free_blocks == sum(pool.blocks[i].block_hash is not None for i in pool._free), \
        "the count of cached free blocks drifted"


def check_kv_cache(kv: KVCacheManager, holders: Iterable[Request], other_tables: Iterable[list[int]] = ()) -> None:
    """Every request holding blocks must be in holders, every other holder's table in other_tables."""
    holders = list(holders)
    check_block_pool(kv.pool, [*(held_blocks(req) for req in holders), *other_tables])
    for req in holders:
        assert req.num_registered_blocks <= len(req.block_ids)
        assert req.block_ids[:req.num_freed_blocks] == [FREED] * req.num_freed_blocks and FREED not in held_blocks(req)
        for i in range(req.num_freed_blocks, req.num_registered_blocks):
            block = kv.pool.blocks[req.block_ids[i]]
            assert not kv.enable_caching or block.block_hash is None or block.block_hash == req.block_hashes[i], (
                f"{req.req_id}: block {block.block_id} is cached under another prefix")


def check_steps_in_flight(steps: StepsInFlight, last_step_id: int) -> None:
    """At most max_steps, the newest ones planned, the token counts add up."""
    assert len(steps) <= steps.max_steps, f"{len(steps)} steps in flight, at most {steps.max_steps}"
    step_ids = [step_id for step_id, _ in steps._steps]
    assert step_ids == list(range(last_step_id - len(step_ids) + 1, last_step_id + 1)), f"steps {step_ids}"
    totals: dict[Request, int] = {}
    for req, num_new in steps.requests():
        assert num_new > 0, f"{req.req_id}: a step in flight computes nothing for it"
        totals[req] = totals.get(req, 0) + num_new
    assert totals == steps._num_tokens, "the tokens in flight do not add up"


def check_swap_space(swap: SwapSpace, reqs: Iterable[Request]) -> None:
    """Every slot is free or held by exactly one request."""
    held = [slot for req in reqs for slot in req.swap_slots]
    slots = held + swap._free + swap._freed_this_plan
    assert sorted(slots) == list(range(swap.num_slots)), f"swap slots leaked or held twice: {sorted(slots)}"


def check_worker_view(view: WorkerView, running: list[Request]) -> None:
    """The workers' block tables are prefixes of the scheduler's (never replaced in place), but for the blocks freed
    behind a sliding window, which the workers keep in their tables and never read."""
    by_id = {req.req_id: req for req in running}
    for req_id, sent in view._sent_block_ids.items():
        assert req_id in by_id, f"the workers hold {req_id}, which is not running"
        freed = by_id[req_id].num_freed_blocks
        assert by_id[req_id].block_ids[freed:len(sent)] == sent[freed:], \
            f"{req_id}: a block the workers hold was replaced"


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
    check_steps_in_flight(sched.steps_in_flight, sched.stats().step_id)
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
    check_worker_view(sched.worker_view, sched.running)
    check_kv_cache(kv, queued, [*sched.remote_kv.leases.block_tables(), *sched.disk_kv.block_tables()])
    assert not any(req.swap_slots for req in queued if req.status is not RequestStatus.WAITING), "swap slots held"
    check_swap_space(sched.swap, queued)
