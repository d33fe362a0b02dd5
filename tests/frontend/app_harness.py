"""Builds the app around the fake engine and tokenizer, and reads SSE bodies, for the test_app* files."""
import json

import httpx

from tinyvllm.frontend.api.app import build_app
from fake_engine import FakeEngine
from fake_tokenizer import CharDetokenizer, CharTokenizer

MODEL = "tiny-test-model"
MAX_MODEL_LEN = 64
REPLY = "Hello world"


def make_app(max_model_len: int = MAX_MODEL_LEN, gate=None, **engine_kwargs):
    """gate: the app's RequestGate (default: build_app's)."""
    tokenizer = CharTokenizer()
    engine = FakeEngine(tokenizer.encode(REPLY, add_special_tokens=False), tokenizer.eos_token_ids[0],
                        max_model_len=max_model_len, **engine_kwargs)
    app = build_app(engine, tokenizer, MODEL, max_model_len, max_body_bytes=64 * 1024,
                    make_detokenizer=CharDetokenizer, gate=gate)
    return app, engine, tokenizer


def client_for(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test", timeout=10)


def parse_sse(body: str) -> list:
    """The data payloads of an SSE body, JSON-decoded except the final '[DONE]'; asserts vLLM's framing."""
    assert body.endswith("\n\n")
    events = body[:-2].split("\n\n")
    payloads = []
    for event in events:
        assert event.startswith("data: ") and "\n" not in event, event
        data = event[len("data: "):]
        payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads
