"""Proxying through a router on a real socket to scripted upstream servers: streams pass through event by event,
failures before the first byte move the request to another instance (at most two retries), a failure mid-stream
ends it with an explicit error event in the route's shape, a client that leaves closes the upstream request, and no
instance means a 503 with Retry-After."""
import asyncio
import json

import httpx
import pytest

from tests.router.harness import WAIT_S, RawUpstream, metric, refused_url, running_router
from tinyvllm.frontend.router.instance_registry import UNHEALTHY

pytestmark = pytest.mark.anyio

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
EVENT_1, EVENT_2 = b'data: {"n":1}\n\n', b'data: {"n":2}\n\n'
DONE = b"data: [DONE]\n\n"


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=WAIT_S, trust_env=False)


def sse_payloads(body: bytes) -> list:
    return [json.loads(e[6:]) if e != b"data: [DONE]" else "[DONE]" for e in body.split(b"\n\n") if e]


async def endless(exchange):
    """An upstream that sends one event, then waits for the router to hang up."""
    await exchange.start()
    await exchange.chunk(EVENT_1)
    await asyncio.wait_for(exchange.peer_closed.wait(), WAIT_S)


async def test_a_stream_passes_through_event_by_event():
    released = asyncio.Event()

    async def answer(exchange):
        await exchange.start()
        await exchange.chunk(EVENT_1)
        await asyncio.wait_for(released.wait(), WAIT_S)
        await exchange.chunk(EVENT_2 + DONE)
        await exchange.end()

    async with RawUpstream(answer) as upstream, running_router({upstream.url: 0}) as router, client() as c:
        async with c.stream("POST", router.url + "/v1/chat/completions", json=CHAT) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            chunks = response.aiter_raw()
            assert await asyncio.wait_for(anext(chunks), WAIT_S) == EVENT_1  # before the upstream sent more
            released.set()
            assert b"".join([chunk async for chunk in chunks]) == EVENT_2 + DONE
        assert json.loads(upstream.exchanges[0].body) == CHAT
        assert metric(router, "requests_total", instance=upstream.url, status="200") == 1


async def test_a_whole_answer_passes_with_its_status_headers_and_query():
    async def answer(exchange):
        await exchange.whole(404, b'{"error": "model \'x\' not found"}', headers=("x-upstream: yes",))

    async with RawUpstream(answer) as upstream, running_router({upstream.url: 0}) as router, client() as c:
        response = await c.post(router.url + "/api/show?verbose=1", json={"model": "x"},
                                headers={"Authorization": "Bearer client-key"})
        assert (response.status_code, response.json()) == (404, {"error": "model 'x' not found"})
        assert response.headers["x-upstream"] == "yes"
        exchange = upstream.exchanges[0]
        assert (exchange.path, exchange.headers["authorization"]) == ("/api/show?verbose=1", "Bearer client-key")


@pytest.mark.parametrize("path", ["/rerank", "/v2/rerank", "/score"])
async def test_the_scoring_routes_outside_v1_pass_too(path):
    async def answer(exchange):
        await exchange.whole(200, b'{"results": []}')

    async with RawUpstream(answer) as upstream, running_router({upstream.url: 0}) as router, client() as c:
        response = await c.post(router.url + path, json={"query": "q", "documents": ["d"]})
        assert (response.status_code, response.json()) == (200, {"results": []})
        assert upstream.exchanges[0].path == path


async def test_the_instance_api_key_replaces_the_clients():
    async def answer(exchange):
        await exchange.whole(200, b'{"object": "list", "data": []}')

    async with RawUpstream(answer) as upstream, \
            running_router({upstream.url: 0}, api_key="router-key", instance_api_key="instance-key") as router, \
            client() as c:
        assert (await c.get(router.url + "/v1/models")).status_code == 401
        response = await c.get(router.url + "/v1/models", headers={"Authorization": "Bearer router-key"})
        assert response.status_code == 200
        assert upstream.exchanges[0].headers["authorization"] == "Bearer instance-key"


async def test_a_refused_connection_moves_the_request_and_makes_that_instance_unavailable():
    async def answer(exchange):
        await exchange.whole(200, b'{"ok": true}')

    dead = refused_url()
    async with RawUpstream(answer) as upstream, running_router({dead: 0, upstream.url: 5}) as router, client() as c:
        response = await c.post(router.url + "/v1/completions", json={"prompt": "Hi"})
        assert (response.status_code, response.json()) == (200, {"ok": True})
        assert router.registry.state(router.registry.get(dead)) == UNHEALTHY
        assert metric(router, "errors_total", instance=dead, reason="connect_failed") == 1
        assert metric(router, "routing_decisions_total", instance=dead, reason="load") == 1


async def test_503s_and_connections_dropped_before_an_answer_are_retried_twice_at_most():
    async def busy(exchange):
        await exchange.whole(503, b'{"error": "busy"}', headers=("retry-after: 1",))

    async def drop(exchange):
        exchange.abort()

    async def streams(exchange):
        await exchange.start()
        exchange.abort()  # headers, but not a byte of the body: the client has seen nothing yet

    async def fine(exchange):
        await exchange.whole(200, b'{"ok": true}')

    async with RawUpstream(busy) as a, RawUpstream(drop) as b, RawUpstream(streams) as c_, RawUpstream(fine) as d:
        async with running_router({a.url: 0, b.url: 1, c_.url: 2, d.url: 3}) as router, client() as c:
            response = await c.post(router.url + "/api/generate", json={"prompt": "Hi"})
            # three tries (a, b, c_) all failed: the client gets a's 503 as it came; d was never asked
            assert (response.status_code, response.json()) == (503, {"error": "busy"})
            assert response.headers["retry-after"] == "1"
            assert (len(a.exchanges), len(b.exchanges), len(c_.exchanges), len(d.exchanges)) == (1, 1, 1, 0)
            assert metric(router, "errors_total", instance=a.url, reason="unavailable") == 1
            assert metric(router, "errors_total", instance=b.url, reason="dropped") == 1
            router.registry.drain(b.url)
            response = await c.post(router.url + "/api/generate", json={"prompt": "Hi"})
            assert (response.status_code, response.json()) == (200, {"ok": True})  # a, c_, then d


async def test_an_instance_failing_mid_stream_ends_the_stream_with_an_error_event():
    async def dies(exchange):
        await exchange.start()
        await exchange.chunk(EVENT_1 + b'data: {"n":')  # one whole event, and half of the next
        await asyncio.sleep(0.05)
        exchange.abort()

    async with RawUpstream(dies) as upstream, running_router({upstream.url: 0}) as router, client() as c:
        response = await c.post(router.url + "/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        payloads = sse_payloads(response.content)
        assert payloads[0] == {"n": 1} and payloads[-1] == "[DONE]" and len(payloads) == 3
        assert payloads[1]["error"]["code"] == 502 and "failed mid-answer" in payloads[1]["error"]["message"]
        assert metric(router, "errors_total", instance=upstream.url, reason="broken_stream") == 1


async def test_an_ollama_stream_failing_midway_ends_with_an_error_line():
    async def dies(exchange):
        await exchange.start(content_type="application/x-ndjson")
        await exchange.chunk(b'{"response":"a","done":false}\n')
        await asyncio.sleep(0.05)
        exchange.abort()

    async with RawUpstream(dies) as upstream, running_router({upstream.url: 0}) as router, client() as c:
        response = await c.post(router.url + "/api/generate", json={"model": "tiny", "prompt": "Hi"})
        lines = [json.loads(line) for line in response.text.splitlines()]
        assert lines[0] == {"response": "a", "done": False}
        assert len(lines) == 2 and "failed mid-answer" in lines[1]["error"]


async def test_a_client_that_leaves_closes_the_upstream_request():
    async with RawUpstream(endless) as upstream, running_router({upstream.url: 0}) as router, client() as c:
        async with c.stream("POST", router.url + "/v1/chat/completions", json=CHAT) as response:
            assert await asyncio.wait_for(anext(response.aiter_raw()), WAIT_S) == EVENT_1
        await asyncio.wait_for(upstream.exchanges[0].peer_closed.wait(), WAIT_S)
        for _ in range(int(WAIT_S / 0.01)):  # the router closes its side right after the upstream's
            if router.registry.get(upstream.url).open == 0 and router.gate.open == 0:
                break
            await asyncio.sleep(0.01)
        assert router.registry.get(upstream.url).open == 0 and router.gate.open == 0


async def test_the_routers_drain_refuses_new_requests_and_lets_open_streams_finish():
    released = asyncio.Event()

    async def answer(exchange):
        await exchange.start()
        await exchange.chunk(EVENT_1)
        await asyncio.wait_for(released.wait(), WAIT_S)
        await exchange.chunk(DONE)
        await exchange.end()

    async with RawUpstream(answer) as upstream, running_router({upstream.url: 0}) as router, client() as c:
        async with c.stream("POST", router.url + "/v1/chat/completions", json=CHAT) as response:
            chunks = response.aiter_raw()
            assert await asyncio.wait_for(anext(chunks), WAIT_S) == EVENT_1
            drain = asyncio.ensure_future(router.gate.drain(WAIT_S, router.shutdown.fail_open))
            refused = await c.post(router.url + "/v1/completions", json={"prompt": "Hi"})
            assert refused.status_code == 503 and refused.headers["connection"] == "close"
            assert (await c.get(router.url + "/health")).status_code == 503
            released.set()
            assert b"".join([chunk async for chunk in chunks]) == DONE
        assert await asyncio.wait_for(drain, WAIT_S) == 0  # nothing left to end with an error
        assert len(upstream.exchanges) == 1


async def test_when_the_drain_runs_out_of_time_open_streams_end_with_an_error():
    async with RawUpstream(endless) as upstream, running_router({upstream.url: 0}) as router, client() as c:
        async with c.stream("POST", router.url + "/v1/chat/completions", json=CHAT) as response:
            chunks = response.aiter_raw()
            assert await asyncio.wait_for(anext(chunks), WAIT_S) == EVENT_1
            router.shutdown.fail_open("The router is shutting down")
            payloads = sse_payloads(b"".join([chunk async for chunk in chunks]))
        assert payloads[0]["error"]["message"] == "The router is shutting down" and payloads[1] == "[DONE]"


async def test_without_a_routable_instance_the_answer_is_503_with_retry_after_in_the_routes_shape():
    async with running_router({}) as router, client() as c:
        openai = await c.post(router.url + "/v1/completions", json={"prompt": "Hi"})
        assert openai.status_code == 503 and openai.headers["retry-after"] == "1"
        assert openai.json()["error"]["type"] == "ServiceUnavailableError"
        ollama = await c.post(router.url + "/api/chat", json={"messages": []})
        assert ollama.status_code == 503 and "No instance" in ollama.json()["error"]
        assert (await c.get(router.url + "/health")).status_code == 503
        assert metric(router, "requests_total", instance="none", status="503") == 2


async def test_request_bodies_are_bounded():
    async with running_router({refused_url(): 0}, max_body_bytes=1000) as router, client() as c:
        response = await c.post(router.url + "/v1/completions", content=b"x" * 1001)
        assert response.status_code == 413 and response.json()["error"]["type"] == "RequestEntityTooLargeError"
