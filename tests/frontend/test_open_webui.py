"""What Open WebUI 0.12.4 sends to tinyvllm and reads back (docs/CLIENTS.md; the payloads are the ones its
check, benchmarks/peers/open_webui_check.sh, logged), and --default-max-tokens, the limit for its task requests."""
from datetime import datetime

import httpx
import pytest

from app_harness import MODEL, REPLY, parse_sse
from fake_engine import FakeEngine
from fake_tokenizer import CharDetokenizer, CharTokenizer
from ollama_harness import MAX_MODEL_LEN, SERVED, make_ollama_app, only_request, parse_ndjson
from tinyvllm.frontend.api.app import build_app
from tinyvllm.frontend.cli.main import build_parser
from tinyvllm.frontend.api.server import ServerArgs

pytestmark = pytest.mark.anyio
CHAT = [{"role": "user", "content": "Hi"}]


def app_with_default_max_tokens(default_max_tokens: int | None):
    tokenizer = CharTokenizer()
    engine = FakeEngine(tokenizer.encode(REPLY, add_special_tokens=False), tokenizer.eos_token_ids[0],
                        max_model_len=MAX_MODEL_LEN)
    app = build_app(engine, tokenizer, MODEL, MAX_MODEL_LEN, make_detokenizer=CharDetokenizer,
                    default_max_tokens=default_max_tokens)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test", timeout=10), engine


async def test_model_list_fields_open_webui_reads(tmp_path):
    client, _, _ = make_ollama_app(tmp_path)
    tags = (await client.get("/api/tags")).json()["models"]
    assert [m["model"] for m in tags] == [SERVED]  # Open WebUI keys its Ollama models by "model"
    (loaded,) = (await client.get("/api/ps")).json()["models"]
    assert loaded["model"] == SERVED
    int(datetime.fromisoformat(loaded["expires_at"]).timestamp())  # as Open WebUI reads it
    assert "version" in (await client.get("/api/version")).json()  # its "verify connection"
    assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == [MODEL]


async def test_open_webui_ollama_chat_payloads(tmp_path):
    client, engine, _ = make_ollama_app(tmp_path)
    streamed = await client.post("/api/chat", json={"model": SERVED, "messages": CHAT, "stream": True})
    *chunks, final = parse_ndjson(streamed)
    assert "".join(c["message"]["content"] for c in chunks) == REPLY
    assert final["done"] and final["done_reason"] == "stop" and final["eval_count"] == len(REPLY) + 1
    engine.requests.clear()
    title = await client.post("/api/chat", json={"model": SERVED, "messages": CHAT, "stream": False,
                                                 "options": {"num_predict": 1000}})  # cut at the context's end
    assert title.status_code == 200 and title.json()["message"]["content"] == REPLY


async def test_open_webui_openai_stream_with_usage(tmp_path):
    client, _, _ = make_ollama_app(tmp_path)
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "stream": True,
                                                        "stream_options": {"include_usage": True}})
    *events, done = parse_sse(r.text)
    assert done == "[DONE]" and events[-1]["usage"]["completion_tokens"] == len(REPLY) + 1
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == REPLY


@pytest.mark.parametrize("body, expected", [({}, 5), ({"max_tokens": 7}, 7), ({"max_completion_tokens": 2}, 2)])
async def test_default_max_tokens_limits_openai_chat_that_sets_none(body, expected):
    client, engine = app_with_default_max_tokens(5)
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, **body})
    assert r.status_code == 200
    assert only_request(engine).sampling.max_tokens == expected


@pytest.mark.parametrize("options, expected", [(None, 5), ({"num_predict": -1}, 5), ({"num_predict": 9}, 9)])
async def test_default_max_tokens_limits_ollama_chat_that_sets_none(options, expected):
    client, engine = app_with_default_max_tokens(5)
    body = {"model": MODEL, "messages": CHAT, "stream": False, **({"options": options} if options else {})}
    assert (await client.post("/api/chat", json=body)).status_code == 200
    assert only_request(engine).sampling.max_tokens == expected


async def test_without_default_max_tokens_chat_runs_to_the_context_end():
    client, engine = app_with_default_max_tokens(None)
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
    assert r.status_code == 200
    req = only_request(engine)
    assert req.sampling.max_tokens == MAX_MODEL_LEN - len(req.prompt_token_ids)


async def test_default_max_tokens_never_passes_the_context():
    client, engine = app_with_default_max_tokens(10_000)
    assert (await client.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})).status_code == 200
    req = only_request(engine)
    assert req.sampling.max_tokens == MAX_MODEL_LEN - len(req.prompt_token_ids)


def test_default_max_tokens_flag():
    args = build_parser().parse_args(["serve", "--default-max-tokens", "512"])
    assert args.default_max_tokens == 512
    assert build_parser().parse_args(["serve"]).default_max_tokens is None
    with pytest.raises(ValueError, match="--default-max-tokens"):
        ServerArgs(default_max_tokens=0).validate()
