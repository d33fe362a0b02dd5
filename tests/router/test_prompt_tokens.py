"""frontend/router/prompt_tokens.py: with --tokenizer the router keys OpenAI prompts by the instances' own block
hashes (the model's tokenizer and chat template, as tinyvllm serve renders them), and anything else by its text."""
import asyncio
import json

import pytest

from tinyvllm.frontend.engine.replica_router import prompt_block_hashes
from tinyvllm.frontend.router.prompt_chunks import request_chunk_hashes
from tinyvllm.frontend.router.prompt_tokens import TokenizedPrompts

BLOCK = 4
TEXT = "The history of the bicycle begins in the early nineteenth century, when inventors experimented. " * 3


@pytest.fixture(scope="module")
def prompts(default_model_path):
    return TokenizedPrompts(str(default_model_path), lambda: BLOCK)


def hashes(prompts, path: str, body) -> list[bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return asyncio.run(prompts.hashes(path, raw))


def test_a_completion_prompt_is_keyed_by_its_tokens(prompts, default_tokenizer):
    expected = prompt_block_hashes(default_tokenizer.encode(TEXT), BLOCK)
    assert len(expected) > 10
    assert hashes(prompts, "/v1/completions", {"model": "m", "prompt": TEXT, "max_tokens": 5}) == expected
    ids = default_tokenizer.encode("a prompt given as token ids, not text")
    assert hashes(prompts, "/v1/completions", {"prompt": ids}) == prompt_block_hashes(ids, BLOCK)


def test_a_chat_is_keyed_by_its_rendered_template(prompts, default_tokenizer):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": TEXT}]
    text = default_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    expected = prompt_block_hashes(default_tokenizer.encode(text), BLOCK)
    assert hashes(prompts, "/v1/chat/completions", {"model": "m", "messages": messages}) == expected
    longer = messages + [{"role": "assistant", "content": "Bicycles."}, {"role": "user", "content": "More."}]
    continued = hashes(prompts, "/v1/chat/completions", {"messages": longer})
    assert continued[:len(expected) - 2] == expected[:len(expected) - 2]  # a conversation keeps its prefix


@pytest.mark.parametrize("path, body", [
    ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": TEXT}]}),  # Ollama: by its text
    ("/v1/chat/completions", {"messages": "not a list", "prompt": TEXT}),  # the instance will refuse it
    ("/v1/completions", {"prompt": [10 ** 9] * 40}),  # out of the vocabulary
    ("/v1/completions", b"{not json"),
])
def test_other_requests_are_keyed_by_their_text(prompts, path, body):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    assert hashes(prompts, path, body) == request_chunk_hashes(raw)
