"""A client that leaves aborts its request. Uses a real uvicorn on 127.0.0.1 (ASGITransport can't disconnect)."""
import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from app_harness import make_app

pytestmark = pytest.mark.anyio

SLOW_LONG = {"max_tokens": 500, "ignore_eos": True}  # 500 steps of 20 ms: only an abort ends it in time


def serve_live(app):
    """The app on a real uvicorn on 127.0.0.1 (a thread): yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(5)
    sock.close()


@pytest.fixture(scope="module")
def live_server():
    app, engine, _ = make_app(max_model_len=1024, step_delay_s=0.02)
    for url in serve_live(app):
        yield url, engine


@pytest.fixture(scope="module")
def live_long_server():
    """A reply of 500 tokens: for the APIs without ignore_eos (only an abort ends it in time)."""
    app, engine, tokenizer = make_app(max_model_len=1024, step_delay_s=0.02)
    engine.choice_replies = [tokenizer.encode("word " * 100, add_special_tokens=False)]
    for url in serve_live(app):
        yield url, engine


async def _wait_until(predicate, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_leaving_a_stream_aborts_the_request(live_server):
    url, engine = live_server
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        async with client.stream("POST", "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Hi"}], "stream": True, **SLOW_LONG}) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            first = json.loads((await anext(lines))[len("data: "):])
            req_id = first["id"]
            await anext(lines)
        # leaving the block closes the connection mid-stream
        await _wait_until(lambda: req_id in engine.aborted)
        await _wait_until(lambda: engine.num_active == 0)
        assert req_id not in engine.finished
        r = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200


async def test_leaving_a_non_streamed_request_aborts_it(live_server):
    url, engine = live_server
    host, port = url.removeprefix("http://").split(":")
    known = set(engine.requests)
    body = json.dumps({"prompt": "Hi", **SLOW_LONG}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    await _wait_until(lambda: set(engine.requests) - known)
    (req_id,) = set(engine.requests) - known
    await asyncio.sleep(0.1)  # some tokens in: the request is decoding, not just queued
    writer.close()
    await writer.wait_closed()
    await _wait_until(lambda: req_id in engine.aborted)
    await _wait_until(lambda: engine.num_active == 0)
    assert req_id not in engine.finished


async def test_leaving_a_parallel_sampling_stream_aborts_every_choice(live_server):
    url, engine = live_server
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        async with client.stream("POST", "/v1/completions", json={
                "prompt": "Hi", "n": 3, "stream": True, **SLOW_LONG}) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            first = json.loads((await anext(lines))[len("data: "):])
            req_id = first["id"]
            await _wait_until(lambda: engine.stats.num_running == 3)
        await _wait_until(lambda: req_id in engine.aborted)
        await _wait_until(lambda: engine.num_active == 0 and engine.stats.num_running == 0)
        assert req_id not in engine.finished


@pytest.mark.parametrize("path,body", [
    ("/v1/messages", {"model": "tiny-test-model", "max_tokens": 500, "messages": [{"role": "user", "content": "Hi"}],
                      "stream": True}),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 500, "stream": True}),
], ids=["anthropic-messages", "responses"])
async def test_leaving_an_anthropic_or_responses_stream_aborts_the_request(live_long_server, path, body):
    url, engine = live_long_server
    before = set(engine.aborted)
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        async with client.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            while "delta" not in await anext(lines):  # the first token's event: the request runs
                pass
        await _wait_until(lambda: set(engine.aborted) - before)
        await _wait_until(lambda: engine.num_active == 0)
