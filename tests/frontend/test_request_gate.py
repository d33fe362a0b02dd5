"""The request gate in the app (frontend/api/request_gate.py): the waiting limit answers 503 + Retry-After before the
body is read, the request deadline ends a request with a 504, the drain refuses new work and ends what is left, and
the engine's typed errors reach the client as their statuses."""
import asyncio

import pytest

from app_harness import MODEL, client_for, make_app, parse_sse
from tinyvllm.frontend.api.request_gate import RequestGate
from tinyvllm.protocol.messages import ErrorKind

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
HI = {"model": MODEL, "prompt": "Hi", "max_tokens": 3}


async def until(condition, timeout_s: float = 5.0) -> None:
    """Lets the event loop run until condition() holds (the app runs in this loop, so no time passes for it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition never held"
        await asyncio.sleep(0.001)


def metric(text: str, name: str) -> float:
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def test_past_the_waiting_limit_new_requests_get_503_with_retry_after_before_their_body_is_read():
    gate = RequestGate(max_waiting=2)
    app, engine, _ = make_app(gate=gate)
    engine.hold.clear()  # nobody gets a first output: both requests keep waiting
    async with client_for(app) as client:
        first = [asyncio.create_task(client.post(COMPL, json=HI)) for _ in range(2)]
        await until(lambda: len(engine.requests) == 2)
        busy = await client.post(COMPL, content=b"{not json")  # refused before anything reads it
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["type"] == "ServiceUnavailableError" and busy.json()["error"]["code"] == 503
        assert "--max-waiting-requests" in busy.json()["error"]["message"]
        ollama = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi"})
        assert ollama.status_code == 503 and set(ollama.json()) == {"error"}
        for path in ("/rerank", "/v1/rerank", "/v2/rerank", "/score", "/v1/score", "/api/rerank"):  # they queue too
            assert (await client.post(path, content=b"{}")).status_code == 503, path
        assert (await client.get("/health")).status_code == 200  # busy is not unhealthy
        metrics = (await client.get("/metrics")).text
        assert metric(metrics, "tinyvllm:num_requests_waiting_admission{") == 2
        rejected = 'tinyvllm:requests_rejected_total{model_name="tiny-test-model",reason="queue_full"}'
        assert metric(metrics, rejected) == 8
        engine.hold.set()
        assert [r.status_code for r in await asyncio.gather(*first)] == [200, 200]
        assert (await client.post(COMPL, json=HI)).status_code == 200
        assert gate.waiting == 0 and gate.open == 0


async def test_a_request_stops_waiting_at_its_first_output():
    gate = RequestGate(max_waiting=1)
    app, engine, _ = make_app(gate=gate, step_delay_s=0.05)
    async with client_for(app) as client:
        running = asyncio.create_task(client.post(COMPL, json={**HI, "max_tokens": 40, "ignore_eos": True}))
        await until(lambda: gate.open == 1 and gate.waiting == 0)  # generating, no longer waiting
        assert (await client.post(COMPL, json=HI)).status_code == 200
        assert (await running).status_code == 200


async def test_the_request_timeout_ends_a_request_with_a_504_and_aborts_it_in_the_engine():
    app, engine, _ = make_app(gate=RequestGate(request_timeout_s=0.2))
    engine.hold.clear()
    async with client_for(app) as client:
        plain = await client.post(COMPL, json=HI)
        assert plain.status_code == 504, plain.text
        assert plain.json()["error"]["type"] == "TimeoutError" and "--request-timeout" in plain.json()["error"]["message"]
        streamed = await client.post(CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                                 "stream": True})
        events = parse_sse(streamed.text)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 504
        ollama = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False})
        assert ollama.status_code == 504 and "--request-timeout" in ollama.json()["error"]
    assert len(engine.aborted) == 3 and not engine.queues


async def test_drain_refuses_new_requests_and_ends_the_open_ones_at_the_shutdown_timeout():
    gate = RequestGate()
    app, engine, _ = make_app(gate=gate)
    engine.hold.clear()
    async with client_for(app) as client:
        open_request = asyncio.create_task(client.post(COMPL, json=HI))
        await until(lambda: len(engine.requests) == 1)
        drain = asyncio.create_task(gate.drain(0.3, engine.fail_open_requests))
        await until(lambda: gate.draining)
        for refused in (await client.post(COMPL, json=HI), await client.get("/health"), await client.get("/v1/models")):
            assert refused.status_code == 503 and refused.headers["connection"] == "close"
        assert (await client.get("/metrics")).status_code == 200
        ended = await open_request
        assert ended.status_code == 503 and "shutting down" in ended.json()["error"]["message"]
        assert await drain == 1
        assert (await client.post("/api/chat", json={"model": MODEL, "messages": []})).json() == {
            "error": "The server is shutting down; retry on another instance."}


async def test_drain_lets_open_requests_finish_within_the_shutdown_timeout():
    gate = RequestGate()
    app, engine, _ = make_app(gate=gate, step_delay_s=0.01)
    async with client_for(app) as client:
        open_requests = [asyncio.create_task(client.post(COMPL, json={**HI, "max_tokens": 10, "ignore_eos": True}))
                         for _ in range(4)]
        await until(lambda: gate.open == 4)
        assert await gate.drain(30, engine.fail_open_requests) == 0
        replies = await asyncio.gather(*open_requests)
        assert [r.json()["choices"][0]["finish_reason"] for r in replies] == ["length"] * 4


@pytest.mark.parametrize("kind, status, openai_type", [
    (ErrorKind.INVALID_REQUEST, 400, "BadRequestError"), (ErrorKind.ENGINE_FAILURE, 500, "InternalServerError"),
    (ErrorKind.UNAVAILABLE, 503, "ServiceUnavailableError"), (None, 500, "InternalServerError")])
async def test_an_engine_error_reaches_the_client_as_its_kind_says(kind, status, openai_type):
    app, _, _ = make_app(fail_after=0, fail_kind=kind)
    async with client_for(app) as client:
        plain = await client.post(COMPL, json=HI)
        assert plain.status_code == status and plain.json()["error"]["type"] == openai_type
        streamed = parse_sse((await client.post(COMPL, json={**HI, "stream": True})).text)
        assert streamed[-2]["error"]["code"] == status
        ollama = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False})
        assert ollama.status_code == status and "worker exploded" in ollama.json()["error"]


async def test_oversized_headers_get_431_in_the_route_family_s_shape():
    app, engine, _ = make_app()
    async with client_for(app) as client:
        padding = {"X-Padding": "x" * 17 * 1024}
        openai = await client.post(COMPL, json=HI, headers=padding)
        ollama = await client.get("/api/tags", headers=padding)
        fine = await client.post(COMPL, json=HI, headers={"X-Padding": "x" * 8 * 1024})
    assert openai.status_code == 431 and openai.json()["error"]["type"] == "RequestHeaderFieldsTooLargeError"
    assert ollama.status_code == 431 and "headers" in ollama.json()["error"]
    assert fine.status_code == 200 and not engine.queues


async def test_a_client_that_stalls_while_sending_its_body_gets_408_and_gives_its_waiting_slot_back(monkeypatch):
    from tinyvllm.frontend.api import request_gate
    monkeypatch.setattr(request_gate, "BODY_TIMEOUT_S", 0.2)
    gate = RequestGate(max_waiting=1)
    app, engine, _ = make_app(gate=gate)
    sent, stalled = [], asyncio.Event()

    async def receive():
        await stalled.wait()  # the headers came; the body never does

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": COMPL, "headers": [(b"content-length", b"100")],
             "query_string": b"", "scheme": "http", "server": ("test", 80), "root_path": "", "http_version": "1.1"}
    await asyncio.wait_for(app(scope, receive, send), 5)
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert b"did not arrive within 0.2 s" in sent[1]["body"] and gate.waiting == gate.open == 0
    async with client_for(app) as client:
        assert (await client.post(COMPL, json=HI)).status_code == 200  # the slot is free again
