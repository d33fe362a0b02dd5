"""benchmarks/fleet_sim.py at a small size: the real `tinyvllm router` in front of 32 simulated instances, multi-turn
chats sharing system prompts, one instance drained and another killed during the run. Every request is answered once,
none reaches a drained or killed instance after the router acknowledged it, and cache-aware routing finds more of the
prompts cached than round-robin. Nothing here depends on how fast the machine is: each run goes on until enough
requests were answered."""
import asyncio
import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("fleet_sim",
                                               pathlib.Path(__file__).parents[2] / "benchmarks" / "fleet_sim.py")
fleet_sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fleet_sim)


def small_fleet(policy: str) -> "fleet_sim.FleetConfig":
    return fleet_sim.FleetConfig(instances=32, routers=1, policy=policy, users=24, duration_s=8.0, min_requests=150,
                                 idle_measure_s=0.0)


async def both_policies():
    return await asyncio.gather(*(fleet_sim.run_fleet(small_fleet(p)) for p in ("cache-aware", "round-robin")))


def test_a_simulated_fleet_keeps_the_routers_invariants_and_cache_aware_routing_hits_more():
    cache_aware, round_robin = asyncio.run(both_policies())
    for result in (cache_aware, round_robin):
        assert result.violations() == []
        assert any(a.sent > result.killed[1] > result.drained[1] for a in result.ok)  # both happened mid-run
        assert len(result.ok) >= 150
    assert cache_aware.hit_rate > round_robin.hit_rate
