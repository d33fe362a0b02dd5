"""A client that leaves an Ollama request aborts it in the engine (a real uvicorn: ASGITransport can't disconnect)."""
import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from app_harness import MODEL
from ollama_harness import build_ollama_app

pytestmark = pytest.mark.anyio
LONG_REPLY = "la " * 70  # 210 steps of 20 ms: only an abort ends it in time


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
    app, engine, _ = build_ollama_app(tmp_path_factory.mktemp("ollama"), reply=LONG_REPLY, step_delay_s=0.02)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", engine
    server.should_exit = True
    thread.join(5)
    sock.close()


async def wait_until(predicate, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_leaving_a_stream_aborts_the_request(live_server):
    url, engine = live_server
    known = set(engine.requests)
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        async with client.stream("POST", "/api/generate", json={"model": MODEL, "prompt": "Hi"}) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            assert json.loads(await anext(lines))["done"] is False
        (req_id,) = set(engine.requests) - known
        await wait_until(lambda: req_id in engine.aborted and engine.num_active == 0)
        assert req_id not in engine.finished


async def test_leaving_a_non_streamed_request_aborts_it(live_server):
    url, engine = live_server
    host, port = url.removeprefix("http://").split(":")
    known = set(engine.requests)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": False}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /api/chat HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    await wait_until(lambda: set(engine.requests) - known)
    (req_id,) = set(engine.requests) - known
    await asyncio.sleep(0.1)
    writer.close()
    await wait_until(lambda: req_id in engine.aborted and engine.num_active == 0)
    assert req_id not in engine.finished
