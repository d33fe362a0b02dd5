"""The app with the real SmolLM2 tokenizer and IncrementalDetokenizer."""
import pytest

from app_harness import client_for, parse_sse
from fake_engine import FakeEngine

from tinyvllm.frontend.api.app import build_app

REPLY = "Hello there! 你好, señor 🙂 done."

pytestmark = pytest.mark.anyio


@pytest.fixture
def served(default_tokenizer):
    engine = FakeEngine(default_tokenizer.encode(REPLY, add_special_tokens=False), default_tokenizer.eos_token_ids[0],
                        max_model_len=2048)
    app = build_app(engine, default_tokenizer, "smollm2", 2048)  # the default detokenizer
    return client_for(app), engine


async def test_completion_text_matches_one_shot_decode(served, default_tokenizer):
    client, engine = served
    r = await client.post("/v1/completions", json={"prompt": "Say hello", "max_tokens": 100})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == REPLY and body["choices"][0]["finish_reason"] == "stop"
    assert engine.requests[body["id"]].prompt_token_ids == default_tokenizer.encode("Say hello")
    assert body["usage"]["prompt_tokens"] == len(default_tokenizer.encode("Say hello"))


async def test_chat_stream_deltas_concatenate_to_the_reply(served, default_tokenizer):
    client, engine = served
    messages = [{"role": "user", "content": "Say hello"}]
    r = await client.post("/v1/chat/completions", json={"messages": messages, "stream": True})
    *chunks, done = parse_sse(r.text)
    assert done == "[DONE]"
    deltas = [c["choices"][0]["delta"].get("content", "") for c in chunks]
    assert "".join(deltas) == REPLY and not any("\ufffd" in d for d in deltas)
    prompt_ids = engine.requests[chunks[0]["id"]].prompt_token_ids
    template = default_tokenizer.apply_chat_template(messages)
    assert prompt_ids == default_tokenizer.encode(template, add_special_tokens=False)
