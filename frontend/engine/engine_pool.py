"""EngineClient's interface over data-parallel replicas: what the HTTP app and the offline LLM speak to.

`--data-parallel-size D` runs D independent engines (frontend/engine/engine_replica.py: each a scheduler and its
workers, restarted by itself when it fails). Each request goes to one replica (frontend/engine/replica_router.py),
which is remembered so that an abort reaches it. The pool serves while any replica does: `dead_reason` is None then, and
the reasons of all of them otherwise (so /health answers 503 only while none can serve). With D = 1 the same
supervision makes a single engine heal itself.
"""
import asyncio
import functools
import pathlib
from collections.abc import AsyncIterator
from contextlib import aclosing
import itertools
from dataclasses import fields

import zmq.asyncio

from tinyvllm.frontend.engine.engine_client import EngineClient, EngineDeadError
from tinyvllm.frontend.engine.held_blocks import HeldBlocks
from tinyvllm.frontend.engine.kv_event_follower import can_follow, follow_kv_events
from tinyvllm.frontend.engine.engine_replica import EngineReplica, RestartPolicy
from tinyvllm.frontend.engine.launcher import EngineProcesses
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.kv_events_config import KVEventsConfig
from tinyvllm.frontend.engine.replica_router import ReplicaRouter, RoutingPolicy, prompt_block_hashes
from tinyvllm.protocol.messages import EngineReady, RequestOutput, SchedulerStats
from tinyvllm.protocol.model_path import resolve_model_path
from tinyvllm.protocol.sampling import SamplingParams


def summed(values: list):
    """Numbers summed; lists of counts (by position) summed element by element; other lists (each replica's running
    requests) joined."""
    if values and isinstance(values[0], list):
        if any(not isinstance(item, int) for items in values for item in items):
            return list(itertools.chain.from_iterable(values))
        return [sum(column) for column in itertools.zip_longest(*values, fillvalue=0)]
    return sum(values)


class EnginePool:
    def __init__(self, replicas: list[EngineReplica], routing: RoutingPolicy = RoutingPolicy(),
                 cache_aware: bool = True, model_path: pathlib.Path | None = None,
                 kv_events: KVEventsConfig | None = None):
        """cache_aware: route by cached prefixes too (pointless without the engines' prefix caching); kv_events:
        the engines' --kv-events-config, which the pool then follows (frontend/engine/kv_event_follower.py) for its
        router and for `held_blocks` (GET /kv_events); None where the engines publish nothing it can follow."""
        self.replicas, self.model_path = replicas, model_path
        self.router = ReplicaRouter(len(replicas), routing)
        self.cache_aware = cache_aware and len(replicas) > 1
        self.kv_events = kv_events if can_follow(kv_events) else None
        self.held_blocks = HeldBlocks(len(replicas)) if self.kv_events is not None else None
        self.ready: EngineReady | None = None
        self._owner: dict[str, EngineReplica] = {}  # open request id -> the replica serving it
        self._supervisors: list[asyncio.Task] = []
        self._followers: list[asyncio.Task] = []

    async def start(self, timeout_s: float = 600.0) -> EngineReady:
        """Starts every replica at once and waits until all are ready; then supervises them."""
        try:
            async with asyncio.TaskGroup() as group:
                starting = [group.create_task(r.start(timeout_s)) for r in self.replicas]
        except ExceptionGroup as failures:
            raise failures.exceptions[0] from None
        for replica, task in zip(self.replicas, starting):
            self._on_ready(replica, task.result())
        # the smallest max_model_len (each scheduler keeps it within its KV pool): a request fits any replica
        self.ready = min((task.result() for task in starting), key=lambda ready: ready.max_model_len)
        self._supervisors = [asyncio.create_task(r.supervise(timeout_s, lambda ready, r=r: self._on_ready(r, ready),
                                                             functools.partial(self._on_failed, r)))
                             for r in self.replicas]
        if self.kv_events is not None:
            ctx = zmq.asyncio.Context.instance()
            self._followers = [asyncio.create_task(follow_kv_events(ctx, self.kv_events, r.index,
                                                                    functools.partial(self._apply_events, r.index)))
                               for r in self.replicas]
        return self.ready

    def _on_ready(self, replica: EngineReplica, ready: EngineReady) -> None:
        self.router.prefixes[replica.index].reset(ready.num_blocks)  # a fresh engine's prefix cache is empty
        if self.held_blocks is not None:
            self.held_blocks.engine_ready(replica.index, ready.block_size, ready.num_blocks)

    def _on_failed(self, replica: EngineReplica) -> None:
        """A dead engine holds nothing: routers elsewhere stop sending its prefixes here at once."""
        if self.held_blocks is not None:
            self.held_blocks.clear(replica.index)

    def _apply_events(self, replica: int, events: list) -> None:
        if self.cache_aware:
            self.router.prefixes[replica].apply_events(events)
        self.held_blocks.apply(replica, events)

    async def wait_until_given_up(self) -> str:
        """Returns why, once some replica has given up restarting."""
        done, _ = await asyncio.wait(self._supervisors, return_when=asyncio.FIRST_COMPLETED)
        task = done.pop()
        if task.exception() is not None:
            return f"an engine's supervisor failed: {task.exception()!r}"
        return task.result()

    @property
    def dead_reason(self) -> str | None:
        if any(r.available for r in self.replicas):
            return None
        return "; ".join(r.failure for r in self.replicas)

    @property
    def stats(self) -> SchedulerStats:
        """Every replica's stats summed."""
        per_replica = [r.stats for r in self.replicas]
        return SchedulerStats(*(summed([getattr(s, f.name) for s in per_replica]) for f in fields(SchedulerStats)))

    def stats_by_engine(self) -> dict[str, SchedulerStats]:
        """Each replica's latest stats by its /metrics `engine` label (zeros while it does not serve)."""
        return {str(r.index): r.stats for r in self.replicas}

    async def generate(self, req_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                       eos_token_ids: list[int]) -> AsyncIterator[RequestOutput]:
        """EngineClient.generate on the replica the router picks."""
        if req_id in self._owner:
            raise ValueError(f"duplicate request id {req_id}")
        replica, hashes = self._route(prompt_token_ids)
        client = replica.client
        self._owner[req_id] = replica
        self.router.opened(replica.index, hashes, sampling.n)
        try:
            async with aclosing(client.generate(req_id, prompt_token_ids, sampling, eos_token_ids)) as outputs:
                async for out in outputs:
                    yield out
        finally:
            del self._owner[req_id]
            self.router.closed(replica.index, sampling.n)

    def _route(self, prompt_token_ids: list[int]) -> tuple[EngineReplica, list[bytes]]:
        serving = {r.index: r.stats for r in self.replicas if r.available}
        if not serving:
            raise EngineDeadError(self.dead_reason)
        if len(self.replicas) == 1:
            return self.replicas[0], []
        hashes = prompt_block_hashes(prompt_token_ids, self.ready.block_size) if self.cache_aware else []
        return self.replicas[self.router.choose(serving, hashes)], hashes

    def abort(self, req_ids: list[str]) -> None:
        for req_id in req_ids:
            if (replica := self._owner.get(req_id)) is not None and replica.available:
                replica.client.abort([req_id])

    def fail_open_requests(self, reason: str) -> None:
        """Ends every open request of every replica with an error (the server's drain ran out of time)."""
        for replica in self.replicas:
            if replica.client is not None:
                replica.client.fail_open_requests(reason)

    async def stop_restarting(self) -> None:
        """From now on a replica that fails stays down (the server is stopping)."""
        for task in self._supervisors + self._followers:
            task.cancel()
        await asyncio.gather(*self._supervisors, *self._followers, return_exceptions=True)
        if self.held_blocks is not None:
            self.held_blocks.close()

    async def close(self) -> None:
        """Stops supervising and asks every replica's scheduler to stop (then stop_processes waits for them)."""
        await self.stop_restarting()
        await asyncio.gather(*(r.close() for r in self.replicas))

    def stop_processes(self) -> None:
        for replica in self.replicas:
            replica.stop_processes()


def launch_pool(config: EngineConfig, restart: RestartPolicy = RestartPolicy()) -> EnginePool:
    """The replicas `config` describes (data_parallel_size of them); nothing starts before EnginePool.start."""
    config.validate()
    size = config.parallel.data_parallel_size

    def launcher(index: int):
        name = "engine" if size == 1 else f"engine {index}"

        def launch() -> tuple[EngineProcesses, EngineClient]:
            procs = EngineProcesses(config, index)
            return procs, EngineClient(procs.endpoints.scheduler_input, procs.endpoints.frontend_output, name,
                                       config.batch.step_timeout_s)
        return EngineReplica(index, launch, name, restart)

    return EnginePool([launcher(i) for i in range(size)], cache_aware=config.cache.enable_prefix_caching,
                      model_path=resolve_model_path(config.model.model), kv_events=config.cache.kv_events_config)
