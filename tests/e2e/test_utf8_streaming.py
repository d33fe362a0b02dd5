"""Streaming replies full of multi-byte characters: every SSE event is valid UTF-8 on its own, no delta carries a
half character (U+FFFD), and the deltas join to exactly the non-streamed reply.

Two ways: through the ASGI app with the real SmolLM2 tokenizer and the real IncrementalDetokenizer, where a fake
engine returns, one token per step, the token ids of a CJK/emoji/accented string (most of its characters span
several byte-level tokens); and through the real server on the tiny random model, whose reply cannot be chosen:
a seeded reply sampled hot is mostly ASCII words with stray partial-character byte tokens, and is compared with
its own stream. (Once logit_bias exists, biasing that reply towards CJK tokens would make it multi-byte too.)
"""
import asyncio
import json

import httpx
import pytest

from tinyvllm.frontend.api.app import build_app
from tests.e2e.http_helpers import completion_body
from tests.e2e.server_process import REQUEST_TIMEOUT_S
from tests.frontend.fake_engine import FakeEngine

REPLY = "你好，世界！🙂🚀 Ünïcödé — 日本語のテキスト 👍🏽 한국어 ✨ 🇫🇷 done"
PROMPT_IDS = [1, 2, 3, 400, 5000]


def events_of(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n\n"), body[-50:]
    return body[:-2].split(b"\n\n")


def check_events(events: list[bytes], is_chat: bool) -> str:
    """Decodes each event strictly on its own; returns the joined text of its deltas, none holding U+FFFD."""
    deltas = []
    for event in events:
        text = event.decode("utf-8")  # strict: raises on a split character
        assert text.startswith("data: "), text
        if text == "data: [DONE]":
            continue
        choice = json.loads(text[len("data: "):])["choices"][0]
        delta = choice["delta"].get("content", "") if is_chat else choice["text"]
        assert "\ufffd" not in delta, (delta, deltas)
        deltas.append(delta)
    return "".join(deltas)


# ---- the ASGI app, a fake engine and the real tokenizer ------------------------------------------------------------

async def asgi_post(app, path: str, body: dict) -> tuple[int, list[bytes]]:
    """The status and every http.response.body message exactly as the app sent them."""
    sent, request = [], {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "client": ("test", 1), "server": ("test", 80)}
    disconnected = asyncio.Event()

    async def receive():
        nonlocal request
        if request is not None:
            message, request = request, None
            return message
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    disconnected.set()
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, [m.get("body", b"") for m in sent if m["type"] == "http.response.body" and m.get("body")]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_multibyte_reply_streams_whole_characters(default_tokenizer, path):
    reply_ids = default_tokenizer.encode(REPLY, add_special_tokens=False)
    assert sum("\ufffd" in default_tokenizer.decode([i]) for i in reply_ids) > 10  # characters really are split
    engine = FakeEngine(reply_ids, default_tokenizer.eos_token_ids[0], max_model_len=2048)
    app = build_app(engine, default_tokenizer, "smollm2", 2048)
    is_chat = path.endswith("chat/completions")
    body = {"messages": [{"role": "user", "content": "Say it"}]} if is_chat else {"prompt": PROMPT_IDS}
    body["max_tokens"] = len(reply_ids) + 1

    status, whole = asyncio.run(asgi_post(app, path, body))
    assert status == 200
    reply = json.loads(b"".join(whole))["choices"][0]
    assert (reply["message"]["content"] if is_chat else reply["text"]) == REPLY

    status, messages = asyncio.run(asgi_post(app, path, {**body, "stream": True}))
    assert status == 200
    events = [event for message in messages for event in events_of(message)]
    assert len(events) > 20  # many deltas, not one
    assert check_events(events, is_chat) == REPLY


# ---- the real server ---------------------------------------------------------------------------------------------

def stream_events(url: str, body: dict) -> list[bytes]:
    """The raw bytes of each SSE event, cut at event boundaries whatever the network chunks were."""
    buffer = b""
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      timeout=REQUEST_TIMEOUT_S) as r:
        assert r.status_code == 200
        for chunk in r.iter_bytes():
            buffer += chunk
    return events_of(buffer)


def test_sampled_reply_streams_as_it_completes(server):
    # temperature 2 spreads the random model over the whole vocabulary: plenty of partial-character tokens
    body = completion_body("Écris-moi en 日本語 🙂", max_tokens=64, temperature=2.0, seed=1234, ignore_eos=True)
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text
    whole = r.json()["choices"][0]["text"]
    events = stream_events(server.url, body)
    deltas = [json.loads(e[len(b"data: "):])["choices"][0]["text"] for e in events if e != b"data: [DONE]"]
    assert "".join(deltas) == whole
    for event in events:
        event.decode("utf-8")  # strict
    if "\ufffd" not in whole:  # the reply holds only whole characters: so must every delta
        assert not any("\ufffd" in d for d in deltas)
