"""EnginePool over fake engines: requests spread over the replicas and a shared prefix stays on one, aborts reach the
replica that has the request, a failed replica gets nothing while the others serve (the pool is dead only when none
does), and /metrics and /health through the app see every replica."""
import asyncio
from contextlib import aclosing

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app_harness import MODEL, client_for
from fake_engine import FakeEngine
from fake_tokenizer import CharDetokenizer, CharTokenizer
from tinyvllm.frontend.api.app import build_app
from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.engine.engine_pool import EnginePool, summed
from tinyvllm.frontend.engine.engine_replica import EngineReplica, RestartPolicy
from tinyvllm.protocol.batch_summary import RunningRequestSummary
from tinyvllm.protocol.sampling import SamplingParams

pytestmark = pytest.mark.anyio
EOS = 2
SHARED_PREFIX = list(range(100, 100 + 3 * 16))


class ReplicaEngine(FakeEngine):
    """FakeEngine as a replica's client (start takes the process check)."""

    async def start(self, timeout_s: float = 600.0, dead_process=None):
        return self.ready


class NoProcesses:
    def start(self) -> None:
        pass

    def dead_process(self) -> None:
        return None

    def stop(self, timeout_s: float = 5.0) -> None:
        pass


async def started_pool(size: int = 2, max_attempts: int = 0) -> tuple[EnginePool, list[ReplicaEngine]]:
    engines = [ReplicaEngine([7, 8, 9], EOS, step_delay_s=0.001) for _ in range(size)]
    never_again = RestartPolicy(max_attempts=max_attempts)
    replicas = [EngineReplica(i, lambda e=e: (NoProcesses(), e), f"engine {i}", never_again)
                for i, e in enumerate(engines)]
    pool = EnginePool(replicas)
    await pool.start(5)
    return pool, engines


async def run(pool: EnginePool, req_id: str, prompt: list[int], max_tokens: int = 3) -> list:
    async with aclosing(pool.generate(req_id, prompt, SamplingParams(max_tokens=max_tokens), [EOS])) as outputs:
        return [out async for out in outputs]


async def test_requests_spread_over_the_replicas_and_a_shared_prefix_stays_on_one():
    pool, engines = await started_pool()
    for i in range(4):
        await run(pool, f"plain-{i}", [i + 1, 5, 6])
    assert [sorted(e.requests) for e in engines] == [["plain-0", "plain-2"], ["plain-1", "plain-3"]]
    await asyncio.gather(*(run(pool, f"shared-{i}", SHARED_PREFIX + [i]) for i in range(6)))
    holders = [e for e in engines if any(r.startswith("shared") for r in e.requests)]
    assert len(holders) == 1 and sum(r.startswith("shared") for r in holders[0].requests) == 6
    await pool.close()


async def test_without_cache_awareness_the_shared_prefix_is_balanced():
    pool, engines = await started_pool()
    pool.cache_aware = False
    await asyncio.gather(*(run(pool, f"shared-{i}", SHARED_PREFIX + [i]) for i in range(6)))
    assert [len(e.requests) for e in engines] == [3, 3]
    await pool.close()


async def test_an_abort_reaches_the_replica_that_has_the_request():
    pool, engines = await started_pool()
    await run(pool, "first", [1, 2, 3])  # so that the next one goes to replica 1
    outputs = pool.generate("long", [4, 5, 6], SamplingParams(max_tokens=1000, ignore_eos=True), [EOS])
    await anext(outputs)
    assert "long" in engines[1].requests
    pool.abort(["long", "unknown"])
    assert engines[1].aborted == ["long"] and engines[0].aborted == []
    await outputs.aclose()
    await pool.close()


async def test_a_request_id_open_on_one_replica_is_refused_on_every_other():
    pool, _ = await started_pool()
    async with aclosing(pool.generate("dup", [1], SamplingParams(max_tokens=50, ignore_eos=True), [EOS])) as first:
        await anext(first)
        with pytest.raises(ValueError, match="duplicate"):
            await run(pool, "dup", [1])
    await pool.close()


async def test_a_failed_replica_gets_nothing_and_the_pool_dies_only_with_the_last():
    pool, engines = await started_pool()
    engines[1].mark_dead("engine 1 process died (tinyvllm-worker0 exited with code -9)")
    assert pool.dead_reason is None
    for i in range(3):
        await run(pool, f"r{i}", [i, 1, 2])
    assert len(engines[0].requests) == 3 and not engines[1].requests
    assert pool.stats_by_engine()["1"].num_free_blocks == 0  # zeros while it does not serve
    engines[0].mark_dead("engine 0 stopped answering: no step finished within 5 s")
    assert "engine 1 process died" in pool.dead_reason and "engine 0 stopped answering" in pool.dead_reason
    with pytest.raises(EngineDeadError, match="engine 0 stopped answering"):
        await run(pool, "late", [1])
    assert "gave up" in await asyncio.wait_for(pool.wait_until_given_up(), 5)
    await pool.close()


async def test_the_blocks_a_dead_replica_held_leave_the_servers_kv_event_view_at_once():
    """GET /kv_events' view (frontend/engine/held_blocks.py): a replica that died holds nothing, before any restart."""
    from tinyvllm.frontend.engine.held_blocks import HeldBlocks
    pool, engines = await started_pool()
    pool.held_blocks = HeldBlocks(2)
    for i in range(2):
        pool._on_ready(pool.replicas[i], engines[i].ready)
    pool._apply_events(0, [{"type": "BlockStored", "block_hashes": [1, 2]}])
    pool._apply_events(1, [{"type": "BlockStored", "block_hashes": [2, 3]}])
    assert len(pool.held_blocks) == 3
    engines[1].mark_dead("engine 1 process died")
    for _ in range(500):
        if len(pool.held_blocks) == 2:
            break
        await asyncio.sleep(0.01)
    assert set(pool.held_blocks._holders) == {1, 2}
    await pool.close()


async def test_the_stats_are_summed_and_kept_apart_by_engine():
    pool, engines = await started_pool()
    outputs = pool.generate("long", [4, 5, 6], SamplingParams(max_tokens=1000, ignore_eos=True), [EOS])
    await anext(outputs)
    by_engine = pool.stats_by_engine()
    assert sorted(by_engine) == ["0", "1"] and [s.num_running for s in by_engine.values()] == [1, 0]
    assert (pool.stats.num_running, pool.stats.num_total_blocks) == (1, 200)
    await outputs.aclose()
    await pool.close()


def test_summing_adds_counts_and_joins_the_running_batches():
    a, b = [RunningRequestSummary("a", 1, 2, 1)], [RunningRequestSummary("b", 3, 4, 2)]
    assert summed([a, b]) == a + b and summed([[], b]) == b and summed([[], []]) == []
    assert summed([[1, 2], [3]]) == [4, 2] and summed([1, 2]) == 3


async def test_the_app_labels_each_engines_metrics_and_is_healthy_while_one_serves():
    pool, engines = await started_pool()
    tokenizer = CharTokenizer()
    client = client_for(build_app(pool, tokenizer, MODEL, 256, make_detokenizer=CharDetokenizer))
    assert (await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})).status_code == 200
    families = {f.name: f for f in text_string_to_metric_families((await client.get("/metrics")).text)}
    assert [s.labels for s in families["vllm:num_requests_running"].samples] == [
        {"model_name": MODEL, "engine": "0"}, {"model_name": MODEL, "engine": "1"}]
    engines[0].mark_dead("engine 0 process died")
    assert (await client.get("/health")).status_code == 200
    assert (await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})).status_code == 200
    engines[1].mark_dead("engine 1 process died")
    assert (await client.get("/health")).status_code == 503
    refused = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert refused.status_code == 503 and "engine 1 process died" in refused.json()["error"]["message"]
    await pool.close()
