"""The router's /dashboard: every instance's /dashboard/snapshot summed, one panel per instance (an unreadable one
says why), the instances' key sent to them, and the router's own key required of whoever watches."""
import asyncio
import json

import httpx
import pytest

from tests.router.harness import RawUpstream, refused_url, running_router

pytestmark = pytest.mark.anyio


def instance_snapshot(running: int, used: int, hits: int, request_id: str, tokens_per_s: float) -> dict:
    return {"model": "m", "time": 1.0, "engine_dead": None, "running": running, "waiting": 1, "preemptions": 2,
            "kv_blocks": {"used": used, "cached": 3, "free": 10, "total": used + 13},
            "prefix_cache": {"queries": 10, "hits": hits, "hit_rate": hits / 10},
            "batch": [{"id": request_id, "prompt_tokens": 5, "generated_tokens": 2, "blocks": 1}],
            "batch_truncated": False, "replicas": [],
            "history": {"time": [1.0], "tokens_per_s": [tokens_per_s], "ttft_s": [0.2]}}


def answering(snapshot: dict):
    async def answer(exchange):
        await exchange.whole(200, json.dumps(snapshot).encode())
    return answer


async def test_instances_are_summed_and_shown_side_by_side():
    async with RawUpstream(answering(instance_snapshot(2, 4, 5, "a", 30.0))) as one, \
            RawUpstream(answering(instance_snapshot(1, 6, 1, "b", 12.5))) as two:
        gone = refused_url()
        async with running_router({one.url: 0, two.url: 0, gone: 0}, api_key="router-key",
                                   instance_api_key="instance-key") as router, httpx.AsyncClient() as client:
            assert (await client.get(router.url + "/dashboard/snapshot")).status_code == 401
            page = await client.get(router.url + "/dashboard?key=router-key")
            assert page.status_code == 200 and "EventSource" in page.text
            reply = await client.get(router.url + "/dashboard/snapshot", headers={"Authorization": "Bearer router-key"})
            snap = reply.json()
    assert "instance-key" not in page.text + reply.text
    assert {e.headers["authorization"] for e in one.exchanges + two.exchanges} == {"Bearer instance-key"}
    assert (snap["running"], snap["waiting"], snap["preemptions"]) == (3, 2, 4)
    assert snap["kv_blocks"] == {"used": 10, "cached": 6, "free": 20, "total": 36}
    assert snap["prefix_cache"] == {"queries": 20, "hits": 6, "hit_rate": 0.3}
    assert [r["id"] for r in snap["batch"]] == ["a", "b"] and snap["engine_dead"] is None
    assert snap["history"]["tokens_per_s"] == [42.5] and snap["history"]["ttft_s"] == [0.2]
    panels = {p["engine"]: p for p in snap["replicas"]}
    assert panels[one.url]["running"] == 2 and panels[two.url]["kv_blocks"]["used"] == 6
    assert panels[one.url]["instance"] == f"{one.url} (both, routable)" and panels[one.url]["error"] is None
    assert panels[gone]["running"] == 0 and panels[gone]["error"].startswith("unreadable")


async def test_an_instance_that_refuses_the_key_is_shown_as_not_read():
    async def refuse(exchange):
        await exchange.whole(401, b'{"error": {}}')
    async with RawUpstream(refuse) as locked:
        async with running_router({locked.url: 0}) as router, httpx.AsyncClient() as client:
            snap = (await client.get(router.url + "/dashboard/snapshot")).json()
    assert snap["replicas"][0]["error"] == "HTTP 401" and snap["running"] == 0 and snap["model"] == "(no instance answered)"


async def test_a_malformed_endless_or_huge_snapshot_is_not_read(monkeypatch):
    from tinyvllm.frontend.router import dashboard_routes
    monkeypatch.setattr(dashboard_routes, "INSTANCE_TIMEOUT_S", 0.5)
    bad = instance_snapshot(1, 1, 1, "x", 1.0) | {"running": "many"}

    async def endless(exchange):
        await exchange.start(content_type="application/json")
        while True:
            await exchange.chunk(b" " * 1000)
            await asyncio.sleep(0.01)

    async def huge(exchange):
        await exchange.whole(200, b" " * (dashboard_routes.MAX_SNAPSHOT_BYTES + 1))
    async with RawUpstream(answering(bad)) as malformed, RawUpstream(endless) as slow, RawUpstream(huge) as big, \
            RawUpstream(answering(instance_snapshot(1, 1, 1, "ok", 1.0))) as good:
        async with running_router({malformed.url: 0, slow.url: 0, big.url: 0, good.url: 0}) as router, \
                httpx.AsyncClient() as client:
            snap = (await client.get(router.url + "/dashboard/snapshot")).json()
    errors = {p["engine"]: p["error"] for p in snap["replicas"]}
    assert errors == {malformed.url: "unreadable: ValueError", slow.url: "no answer in time",
                      big.url: "snapshot too large", good.url: None}
    assert snap["running"] == 1 and [r["id"] for r in snap["batch"]] == ["ok"]
