"""/instances over HTTP: registration by heartbeat (behind the register secret), listing, deregistration, the
operator's drain; the router's /health and /metrics; and serve's heartbeat sender against a real router."""
import asyncio

import httpx
import pytest

from tests.router.harness import WAIT_S, running_router, until
from tinyvllm.frontend.api.router_registration import Registration, RouterHeartbeat
from tinyvllm.protocol.messages import SchedulerStats

pytestmark = pytest.mark.anyio

SECRET = "s3cret-s3cret-s3cret"
AUTH = {"Authorization": f"Bearer {SECRET}"}
A = "http://10.0.0.1:8000"
BEAT = {"url": A, "role": "both", "model": "tiny", "running": 1, "waiting": 2, "kv_usage": 0.25, "draining": False}


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=WAIT_S, trust_env=False)


async def test_registration_listing_and_deregistration():
    async with running_router(register_secret=SECRET) as router, client() as c:
        assert (await c.post(router.url + "/instances/heartbeat", json=BEAT)).status_code == 401
        assert (await c.get(router.url + "/instances")).status_code == 401
        assert (await c.get(router.url + "/health")).status_code == 503
        reply = await c.post(router.url + "/instances/heartbeat", json=BEAT, headers=AUTH)
        assert reply.json() == {"url": A, "state": "routable"}
        assert (await c.get(router.url + "/health")).status_code == 200
        [row] = (await c.get(router.url + "/instances", headers=AUTH)).json()["instances"]
        assert (row["url"], row["source"], row["state"], row["load"]) == \
            (A, "registered", "routable", {"running": 1, "waiting": 2, "kv_usage": 0.25})
        metrics = (await c.get(router.url + "/metrics")).text
        assert 'tinyvllm_router:instances{state="routable"} 1.0' in metrics
        reply = await c.post(router.url + "/instances/deregister", json={"url": A}, headers=AUTH)
        assert reply.json() == {"url": A, "open_requests": 0, "removed": True}
        assert (await c.get(router.url + "/instances", headers=AUTH)).json() == {"instances": []}


async def test_bad_heartbeats_are_400s():
    async with running_router() as router, client() as c:
        for body in ({**BEAT, "url": "10.0.0.1:8000"}, {**BEAT, "running": -1}, {**BEAT, "role": "mixed"},
                     {**BEAT, "kv_usage": 2}, {"model": "tiny"}):
            reply = await c.post(router.url + "/instances/heartbeat", json=body)
            assert reply.status_code == 400, body
            assert reply.json()["error"]["type"] == "BadRequestError"


async def test_an_instance_drained_by_the_operator_leaves_and_is_not_let_back_in():
    async with running_router() as router, client() as c:
        await c.post(router.url + "/instances/heartbeat", json=BEAT)
        instance = router.registry.get(A)
        router.registry.opened(instance)  # a request of the router's still runs there
        reply = await c.post(router.url + "/instances/drain", json={"url": A})
        assert reply.json() == {"url": A, "open_requests": 1, "removed": False}
        assert (await c.get(router.url + "/instances")).json()["instances"][0]["state"] == "draining"
        router.registry.closed(instance)
        assert (await c.get(router.url + "/instances")).json() == {"instances": []}
        assert (await c.post(router.url + "/instances/heartbeat", json=BEAT)).status_code == 409
        assert (await c.post(router.url + "/instances/drain", json={"url": A})).status_code == 404


async def test_serves_heartbeat_sender_registers_reports_draining_and_leaves():
    stats = SchedulerStats(num_running=3, num_waiting=1, num_free_blocks=30, num_total_blocks=40)
    draining = False
    async with running_router(register_secret=SECRET) as router:
        heartbeat = RouterHeartbeat(Registration(router.url, A, SECRET), "tiny", lambda: stats, lambda: True,
                                    lambda: draining, interval_s=0.05)
        heartbeat.start()
        await until(lambda: router.registry.get(A) is not None)
        instance = router.registry.get(A)
        assert (instance.model, instance.load.running, instance.load.waiting, instance.load.kv_usage) == \
            ("tiny", 3, 1, 0.25)
        draining = True
        heartbeat.wake()
        await until(lambda: instance.load.draining)
        assert router.registry.routable() == []
        await heartbeat.leave()
        assert router.registry.get(A) is None


async def test_no_heartbeat_goes_out_while_no_engine_serves():
    async with running_router() as router:
        heartbeat = RouterHeartbeat(Registration(router.url, A, ""), "tiny", SchedulerStats, lambda: False,
                                    lambda: False, interval_s=0.01)
        heartbeat.start()
        await asyncio.sleep(0.2)  # a few intervals: none may register it
        assert router.registry.get(A) is None
        await heartbeat.leave()
