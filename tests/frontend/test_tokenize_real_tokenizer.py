"""/tokenize and /detokenize with the real SmolLM2 tokenizer: vocabulary token strings, exact round trips."""
import pytest

from app_harness import client_for
from fake_engine import FakeEngine
from tinyvllm.frontend.api.app import build_app

TEXT = "Hello world! 你好 🙂 <|im_end|>"

pytestmark = pytest.mark.anyio


@pytest.fixture
def client(default_tokenizer):
    engine = FakeEngine([1], default_tokenizer.eos_token_ids[0], max_model_len=2048)
    return client_for(build_app(engine, default_tokenizer, "smollm2", 2048))


async def test_token_strs_are_vocabulary_entries(client, default_tokenizer):
    body = (await client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True})).json()
    assert body["token_strs"] == ["Hello", "Ġworld"] and body["tokens"] == default_tokenizer.encode("Hello world")


async def test_round_trip_keeps_special_tokens_and_multibyte_text(client, default_tokenizer):
    ids = (await client.post("/tokenize", json={"prompt": TEXT})).json()["tokens"]
    assert default_tokenizer.token_to_id("<|im_end|>") in ids  # a control token, as the chat template writes it
    assert (await client.post("/detokenize", json={"tokens": ids})).json() == {"prompt": TEXT}


async def test_chat_form_matches_the_template(client, default_tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    body = (await client.post("/tokenize", json={"messages": messages})).json()
    expected = default_tokenizer.encode(default_tokenizer.apply_chat_template(messages), add_special_tokens=False)
    assert body["tokens"] == expected and body["count"] == len(expected)
