"""--api-key: /v1 and /api routes need `Authorization: Bearer <key>` (401 in OpenAI's or Ollama's shape otherwise);
every other route stays open; streaming and disconnects still work through the middleware."""
import asyncio
import json
import time

import httpx
import pytest

from app_harness import MODEL, client_for, parse_sse
from fake_engine import FakeEngine
from fake_tokenizer import CharDetokenizer, CharTokenizer
from threaded_server import served
from tinyvllm.frontend.api.app import build_app
from tinyvllm.frontend.api.auth import APIKeyMiddleware

pytestmark = pytest.mark.anyio

KEY = "sk-test-Ünïcode-key"
GOOD = {"Authorization": f"Bearer {KEY}".encode()}  # header bytes: a non-ASCII key travels as UTF-8
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


def make_app(api_key: str | None = KEY, **engine_kwargs):
    tokenizer = CharTokenizer()
    engine = FakeEngine(tokenizer.encode("Hello", add_special_tokens=False), tokenizer.eos_token_ids[0],
                        max_model_len=1024, **engine_kwargs)
    return build_app(engine, tokenizer, MODEL, 1024, make_detokenizer=CharDetokenizer, api_key=api_key), engine


@pytest.fixture
def client():
    return client_for(make_app()[0])


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"prompt": "Hi"}),
    ("POST", "/v1/chat/completions", CHAT),
    ("GET", "/v1/no-such-route", None),  # refused before routing: no probing for routes without the key
    *(("POST", path, {"query": "q", "documents": ["d"]}) for path in ("/rerank", "/v1/rerank", "/v2/rerank")),
    ("POST", "/score", {"text_1": "q", "text_2": "d"}),
])
@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY.encode()}, {"Authorization": f"Basic {KEY}".encode()},
    {"Authorization": f"Bearer {KEY}x".encode()}, {"Authorization": "Bearer"}, {"X-API-Key": KEY.encode()},
], ids=["none", "wrong-key", "no-scheme", "basic", "longer-key", "empty-bearer", "other-header"])
async def test_v1_refuses_without_the_key(client, method, path, body, headers):
    r = await client.request(method, path, json=body, headers=headers)
    assert r.status_code == 401
    assert r.json() == {"error": {"message": "Unauthorized", "type": "AuthenticationError", "param": None,
                                  "code": 401}}
    assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("path", ["/api/tags", "/api/chat", "/api/no-such-route", "/api"])
async def test_api_refuses_in_ollamas_shape(client, path):
    r = await client.post(path, json={})
    assert r.status_code == 401 and r.json() == {"error": "unauthorized"}


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
async def test_the_key_opens_v1(client, scheme):
    r = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3},
                          headers={"Authorization": f"{scheme} {KEY}".encode()})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "Hel"
    assert (await client.get("/v1/models", headers=GOOD)).json()["data"][0]["id"] == MODEL


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/health", None), ("GET", "/metrics", None), ("GET", "/version", None), ("GET", "/openapi.json", None),
    ("POST", "/tokenize", {"prompt": "Hi"}), ("POST", "/detokenize", {"tokens": [75]}),
    ("GET", "/v1x", None),  # not under /v1/: an unknown route, open like any other
])
async def test_other_routes_stay_open(client, method, path, body):
    r = await client.request(method, path, json=body)
    assert r.status_code == (404 if path == "/v1x" else 200), r.text


async def test_cors_preflight_is_not_refused(client):
    r = await client.options("/v1/completions")
    assert r.status_code != 401  # preflights carry no credentials (405 here: there is no CORS middleware)


async def test_without_a_key_everything_is_open():
    client = client_for(make_app(api_key=None)[0])
    assert (await client.get("/v1/models")).status_code == 200
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


def test_an_empty_key_is_refused():
    with pytest.raises(ValueError):
        APIKeyMiddleware(lambda *a: None, "")


async def test_streams_pass_through_the_middleware(client):
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=GOOD)
    *chunks, done = parse_sse(r.text)
    assert done == "[DONE]"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hel"


async def test_a_client_leaving_a_stream_still_aborts_it_through_the_middleware():
    app, engine = make_app(step_delay_s=0.02)
    with served(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            body = {**CHAT, "stream": True, "max_tokens": 500, "ignore_eos": True}
            async with c.stream("POST", "/v1/chat/completions", json=body, headers=GOOD) as r:
                lines = r.aiter_lines()
                req_id = json.loads((await anext(lines))[len("data: "):])["id"]
        deadline = time.monotonic() + 5
        while req_id not in engine.aborted:
            assert time.monotonic() < deadline, "the request was not aborted"
            await asyncio.sleep(0.01)
        assert req_id not in engine.finished


async def test_openapi_documents_the_key():
    doc = (await client_for(make_app()[0]).get("/openapi.json")).json()
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, methods in doc["paths"].items():
        for op in methods.values():
            protected = path.startswith(("/v1/", "/v2/", "/api/")) or path in ("/v1", "/api", "/rerank", "/score")
            assert (op.get("security") == [{"bearer": []}]) == protected, path
            if protected and "default" not in op["responses"]:
                assert "401" in op["responses"], path
