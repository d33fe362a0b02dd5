"""A tiny random Qwen3 that thinks (tests/helpers/tiny_reasoning_model.py: its template opens a think block),
served: its thinking comes as reasoning_content apart from content, streamed and not; a thinking budget makes the
reply close the thinking after that many tokens (the random model never would), a JSON schema constrains the answer
after the thinking, not the thinking; enable_thinking false makes every token content; Anthropic's thinking
budget_tokens through the official SDK and Ollama's think give the same split."""
import json

import anthropic
import httpx
import pytest

from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S, start_server
from tests.helpers.tiny_reasoning_model import make_thinking_qwen3

QUESTION = [{"role": "user", "content": "Is the sea calm today?"}]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    folder = make_thinking_qwen3(tmp_path_factory.mktemp("thinking-qwen3"))
    server = start_server(folder, folder / "server.log", "--max-model-len", "256", "--num-kv-blocks", "64")
    yield server
    assert not server.stop(), server.leftover_description


def chat(server, **body) -> dict:
    response = httpx.post(server.url + "/v1/chat/completions", timeout=REQUEST_TIMEOUT_S, json={
        "model": MODEL_NAME, "messages": QUESTION, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def test_the_budget_ends_the_thinking_and_the_answer_follows(thinker):
    free = chat(thinker, max_tokens=12, ignore_eos=True, logprobs=True)
    free_tokens = [entry["token"] for entry in free["logprobs"]["content"]]
    assert "</think>" not in free_tokens and free["message"]["content"] in (None, "")  # all thinking
    assert free["message"]["reasoning_content"] and free["message"]["reasoning"] == free["message"]["reasoning_content"]
    choice = chat(thinker, max_tokens=12, ignore_eos=True, logprobs=True, thinking_token_budget=4)
    tokens = [entry["token"] for entry in choice["logprobs"]["content"]]
    assert tokens[:4] == free_tokens[:4] and tokens[4] == "</think>" and "</think>" not in tokens[5:]
    message = choice["message"]
    assert message["reasoning_content"].strip() == "".join(tokens[:4]).strip()
    assert message["content"] and message["content"] == "".join(tokens[5:]).lstrip()

    response = httpx.post(thinker.url + "/v1/chat/completions", timeout=REQUEST_TIMEOUT_S, json={
        "model": MODEL_NAME, "messages": QUESTION, "temperature": 0, "max_tokens": 12, "ignore_eos": True,
        "thinking_token_budget": 4, "stream": True})
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in response.text.splitlines()
              if line.startswith("data: {")]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]


def test_a_json_schema_constrains_the_answer_after_the_thinking(thinker):
    schema = {"type": "object", "properties": {"sea": {"enum": ["calm", "rough"]}}, "required": ["sea"],
              "additionalProperties": False}
    message = chat(thinker, max_tokens=40, thinking_token_budget=3, response_format={
        "type": "json_schema", "json_schema": {"name": "sea", "schema": schema}})["message"]
    assert message["reasoning_content"] and json.loads(message["content"])["sea"] in ("calm", "rough")


def test_enable_thinking_false_makes_every_token_content(thinker):
    choice = chat(thinker, max_tokens=8, ignore_eos=True, chat_template_kwargs={"enable_thinking": False})
    assert choice["message"]["content"] and not choice["message"].get("reasoning_content")


def test_anthropic_thinking_budget_and_ollama_think(thinker):
    client = anthropic.Anthropic(base_url=thinker.url, api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)
    message = client.messages.create(model=MODEL_NAME, max_tokens=12, messages=QUESTION, extra_body={"temperature": 0},
                                     thinking={"type": "enabled", "budget_tokens": 4})
    assert [block.type for block in message.content] == ["thinking", "text"], message
    assert message.content[1].text == chat(thinker, max_tokens=12, thinking_token_budget=4)["message"]["content"]
    ollama = httpx.post(thinker.url + "/api/chat", timeout=REQUEST_TIMEOUT_S, json={
        "model": MODEL_NAME, "messages": QUESTION, "think": True, "stream": False,
        "options": {"temperature": 0, "num_predict": 6}}).json()
    assert ollama["message"]["thinking"] and not ollama["message"]["content"]  # no budget: it thinks throughout
