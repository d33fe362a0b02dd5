"""The official `ollama` Python client, unmodified, against a real `tinyvllm serve` on the tiny model: generate,
chat (streamed and not), tags, show, ps, embed, copy, create, delete, pull. Greedy replies (and embeddings) must
match the OpenAI routes' for the same input, so the Ollama layer changes the API, not the tokens."""
import httpx
import ollama
import pytest

from tests.e2e.http_helpers import chat_body, complete
from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S, start_server

SERVED = MODEL_NAME + ":latest"
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def store_server(tiny_model, tmp_path_factory):
    """A server of its own, so that the models it creates live in a temporary --models-dir (generation tests use
    the shared server, whose kernels other tests have already compiled)."""
    folder = tmp_path_factory.mktemp("ollama")
    server = start_server(tiny_model, folder / "server.log", "--models-dir", str(folder / "models"))
    yield server
    left = server.stop()
    assert not left, f"the server left processes running: {server.leftover_description}"


def test_generate_matches_the_completions_route(server):
    client = ollama.Client(host=server.url, timeout=REQUEST_TIMEOUT_S)
    prompt = "The capital of France is"
    reply = client.generate(model=MODEL_NAME, prompt=prompt, raw=True, options=GREEDY)
    text, _ = complete(server.url, "/v1/completions",
                       {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert reply.response == text and reply.done and reply.eval_count <= 8
    assert reply.total_duration > reply.eval_duration > 0 and reply.prompt_eval_count > 0
    first = client.generate(model=MODEL_NAME, prompt="Hello", options=GREEDY)
    assert first.context and first.done_reason in ("stop", "length")
    more = client.generate(model=MODEL_NAME, prompt="And then?", context=first.context, options=GREEDY)
    assert more.prompt_eval_count > len(first.context) and len(more.context) > len(first.context)


def test_chat_streamed_and_not_match_the_chat_route(server):
    client = ollama.Client(host=server.url, timeout=REQUEST_TIMEOUT_S)
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    whole = client.chat(model=MODEL_NAME, messages=messages, options=GREEDY)
    pieces = list(client.chat(model=MODEL_NAME, messages=messages, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in pieces) == whole.message.content and pieces[-1].done
    assert pieces[-1].done_reason == whole.done_reason and pieces[-1].eval_count == whole.eval_count
    text, _ = complete(server.url, "/v1/chat/completions",
                       chat_body(messages[0]["content"], max_tokens=8, temperature=0))
    assert whole.message.role == "assistant" and whole.message.content == text


def test_model_routes_and_the_store(store_server, default_model_path):
    client = ollama.Client(host=store_server.url, timeout=REQUEST_TIMEOUT_S)
    assert [m.model for m in client.list().models] == [SERVED]
    shown = client.show(MODEL_NAME)
    assert shown.details.format == "gguf" and shown.modelinfo["llama.block_count"] == 2 and shown.template
    (running,) = client.ps().models
    assert running.name == SERVED and running.context_length > 0
    assert client.pull(MODEL_NAME).status == "success"
    assert client.copy(MODEL_NAME, "backup").status == "success"
    assert client.create(model="pirate", from_=MODEL_NAME, system="You are a pirate.",
                         parameters={"temperature": 0, "num_predict": 4}).status == "success"
    assert "SYSTEM \"\"\"You are a pirate.\"\"\"" in client.show("pirate").modelfile
    assert client.generate(model="pirate", prompt="Hi", raw=True).eval_count <= 4  # a short prompt: few kernels
    other = str(default_model_path)  # weights this server does not run
    assert client.create(model="smollm", from_=other).status == "success"
    with pytest.raises(ollama.ResponseError) as refused:
        client.generate(model="smollm", prompt="Hi")
    assert refused.value.status_code == 400 and f"serves only '{SERVED}'" in refused.value.error
    listed = [m.model for m in client.list().models]
    assert listed == [SERVED, "backup:latest", "pirate:latest", "smollm:latest"]
    ids = [m["id"] for m in httpx.get(store_server.url + "/v1/models", timeout=30).json()["data"]]
    assert ids == [MODEL_NAME, "backup", "pirate", "smollm"]
    for name in ("backup", "pirate", "smollm"):
        assert client.delete(name).status == "success"
    assert [m.model for m in client.list().models] == [SERVED]
    with pytest.raises(ollama.ResponseError) as missing:
        client.pull("llama3.2")
    assert missing.value.status_code == 404


def test_embed_matches_the_embeddings_route(server):
    client = ollama.Client(host=server.url, timeout=REQUEST_TIMEOUT_S)
    result = client.embed(model=MODEL_NAME, input=["Hello", "The sea"])
    assert len(result.embeddings) == 2 and result.prompt_eval_count > 0
    openai_style = httpx.post(server.url + "/v1/embeddings", json={"model": MODEL_NAME, "input": ["Hello", "The sea"]},
                              timeout=REQUEST_TIMEOUT_S).json()["data"]
    for ours, theirs in zip(result.embeddings, (d["embedding"] for d in openai_style)):
        assert len(ours) == len(theirs) > 0 and max(abs(a - b) for a, b in zip(ours, theirs)) < 1e-5
    assert abs(sum(x * x for x in result.embeddings[0]) - 1) < 1e-4
    legacy = client.embeddings(model=MODEL_NAME, prompt="Hello").embedding
    assert max(abs(a - b) for a, b in zip(legacy, result.embeddings[0])) < 1e-5  # the engine's are normalized too
