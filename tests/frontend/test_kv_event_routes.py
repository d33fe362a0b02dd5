"""GET /kv_events on a real socket: the whole set then the changes, a keep-alive comment while quiet, 404 without
followed KV events, 503 past the bound, the API key, and the end of every stream when the server drains."""
import asyncio
import json

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware

from tinyvllm.frontend.api import kv_event_routes
from tinyvllm.frontend.api.auth import APIKeyMiddleware
from tinyvllm.frontend.api.request_gate import GateMiddleware, RequestGate
from tinyvllm.frontend.api.uvicorn_runner import QuietSignalServer, start_serving
from tinyvllm.frontend.engine.held_blocks import HeldBlocks

pytestmark = pytest.mark.anyio
KEY = "route-test-key-0123456789"


class Engine:
    def __init__(self, held):
        self.held_blocks = held


async def serving(engine, gate):
    app = Starlette(routes=kv_event_routes.kv_event_routes(engine, gate),
                    middleware=[Middleware(APIKeyMiddleware, api_key=KEY), Middleware(GateMiddleware, gate=gate)])
    server = QuietSignalServer(uvicorn.Config(app, host="127.0.0.1", port=0, loop="none", log_level="warning",
                                              lifespan="off", timeout_graceful_shutdown=1))
    task = await start_serving(server)
    return server, task, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


async def lines(stream, count: int) -> list[str]:
    """The next `count` non-empty lines of `stream` (a response's aiter_lines()), fewer if it ends."""
    got = []
    while len(got) < count:
        try:
            line = await anext(stream)
        except StopAsyncIteration:
            return got
        if line:
            got.append(line)
    return got


async def test_the_stream_of_held_blocks(monkeypatch):
    monkeypatch.setattr(kv_event_routes, "PING_S", 0.1)
    monkeypatch.setattr(kv_event_routes, "QUIET_CHECK_S", 0.05)
    monkeypatch.setattr(kv_event_routes, "MAX_STREAMS", 1)
    held, gate = HeldBlocks(1), RequestGate()
    held.engine_ready(0, 16, 64)
    held.apply(0, [{"type": "BlockStored", "block_hashes": [4, 5]}])
    server, task, url = await serving(Engine(held), gate)
    auth = {"authorization": f"Bearer {KEY}"}
    try:
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            assert (await client.get(url + "/kv_events")).status_code == 401
            async with client.stream("GET", url + "/kv_events", headers=auth) as response:
                assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
                stream = response.aiter_lines()
                (whole,) = await lines(stream, 1)
                assert json.loads(whole[6:]) == {"block_size": 16, "num_blocks": 64, "events": [
                    {"type": "AllBlocksCleared"}, {"type": "BlockStored", "block_hashes": [4, 5]}]}
                busy = await client.get(url + "/kv_events", headers=auth)  # the bound: one stream here
                assert busy.status_code == 503 and busy.json()["error"]["code"] == 503
                assert await lines(stream, 1) == [": ping"]  # quiet: the keep-alive
                held.apply(0, [{"type": "BlockRemoved", "block_hashes": [4]}])
                for _ in range(100):  # after any keep-alives
                    if (line := (await lines(stream, 1))[0]).startswith("data: "):
                        break
                assert json.loads(line[6:]) == {"events": [{"type": "BlockRemoved", "block_hashes": [4]}]}
                gate.draining = True  # as RequestGate.drain sets it
                assert set(await asyncio.wait_for(lines(stream, 99), 5)) <= {": ping"}  # it ends
            assert len(held._subscribers) == 0
    finally:
        server.should_exit = True
        await task


async def test_a_server_without_followed_kv_events_answers_404():
    server, task, url = await serving(Engine(None), RequestGate())
    try:
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            reply = await client.get(url + "/kv_events", headers={"authorization": f"Bearer {KEY}"})
        assert reply.status_code == 404 and "--kv-events-config" in reply.json()["error"]["message"]
    finally:
        server.should_exit = True
        await task
