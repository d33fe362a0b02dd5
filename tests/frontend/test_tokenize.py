"""POST /tokenize, POST /detokenize and GET /version, shaped as vLLM serves them, with OpenAI-shaped 400s."""
import importlib.metadata

import pytest

from app_harness import MAX_MODEL_LEN, MODEL
from tinyvllm.frontend.api import ops_routes
from tinyvllm.frontend.api.serving import LONG_INPUT_CHARS

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


async def tokenize(client, **body) -> dict:
    r = await client.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def test_prompt_form(served):
    client, _, tokenizer = served
    body = await tokenize(client, prompt="Hi!")
    assert body == {"count": 4, "max_model_len": MAX_MODEL_LEN, "tokens": tokenizer.encode("Hi!"), "token_strs": None}
    assert (await tokenize(client, prompt="Hi!", add_special_tokens=False))["tokens"] == tokenizer.encode("Hi!", False)
    assert (await tokenize(client, model=MODEL, prompt="Hi", return_token_strs=True))["token_strs"] == ["<s>", "H", "i"]


async def test_counts_match_what_generation_sends_to_the_engine(served):
    client, engine, _ = served
    for path, body, form in [
        ("/v1/completions", {"prompt": "Hello"}, {"prompt": "Hello"}),
        ("/v1/chat/completions", {"messages": MESSAGES}, {"messages": MESSAGES}),
        ("/v1/chat/completions", {"messages": MESSAGES, "add_special_tokens": True},
         {"messages": MESSAGES, "add_special_tokens": True}),
    ]:
        r = await client.post(path, json={**body, "max_tokens": 2})
        assert r.status_code == 200, r.text
        sent = engine.requests[r.json()["id"]].prompt_token_ids
        tokenized = await tokenize(client, **form)
        assert tokenized["tokens"] == sent and tokenized["count"] == r.json()["usage"]["prompt_tokens"]


async def test_chat_form_renders_the_template(served):
    client, _, tokenizer = served
    with_prompt = await tokenize(client, messages=MESSAGES)
    without = await tokenize(client, messages=MESSAGES, add_generation_prompt=False)
    assert tokenizer.decode(with_prompt["tokens"]) == "<system>Be brief.\n<user>Hi\n<assistant>"
    assert tokenizer.decode(without["tokens"]) == "<system>Be brief.\n<user>Hi\n"
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert (await tokenize(client, messages=parts))["tokens"] == \
        (await tokenize(client, messages=[{"role": "user", "content": "Hi"}]))["tokens"]


async def test_long_input_is_tokenized(served):
    client, _, _ = served
    text = "x" * (LONG_INPUT_CHARS + 10)  # tokenized off the event loop; no max_model_len check here
    assert (await tokenize(client, prompt=text))["count"] == len(text) + 1
    r = await client.post("/detokenize", json={"tokens": [ord("x") + 3] * (LONG_INPUT_CHARS + 10)})
    assert r.json() == {"prompt": text}


async def test_detokenize_round_trips_with_special_tokens(served):
    client, _, tokenizer = served
    ids = (await tokenize(client, prompt="Grüße 🙂"))["tokens"]
    r = await client.post("/detokenize", json={"model": MODEL, "tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": "<s>Grüße 🙂"}
    assert (await client.post("/detokenize", json={"tokens": []})).json() == {"prompt": ""}


@pytest.mark.parametrize("path,body,param", [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": ["a"]}, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": MESSAGES}, "prompt"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": "hi"}, "messages"),
    ("/tokenize", {"messages": [{"content": "hi"}]}, "messages"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "hi"}]}, "messages"),  # the template refuses it
    ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"prompt": "a", "return_token_strs": 1}, "return_token_strs"),
    ("/tokenize", {"messages": MESSAGES, "add_generation_prompt": "no"}, "add_generation_prompt"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, "continue_final_message"),
    ("/tokenize", {"prompt": "a", "model": 3}, "model"),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/detokenize", {"tokens": [1, True]}, "tokens"),
    ("/detokenize", {"tokens": [1, 2.0]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [10**30]}, "tokens"),
])
async def test_bad_input_is_an_openai_400(served, path, body, param):
    client, _, _ = served
    r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == 400 and error["type"] == "BadRequestError", error


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_body_must_be_a_json_object(served, path):
    client, _, _ = served
    for content in (b"{not json", b"[1, 2]", b"NaN"):
        r = await client.post(path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == 400


@pytest.mark.parametrize("path,body", [("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [5]})])
async def test_unknown_model_is_a_404(served, path, body):
    client, _, _ = served
    r = await client.post(path, json={**body, "model": "gpt-4"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


async def test_version_comes_from_the_package_metadata(served, monkeypatch):
    client, _, _ = served
    assert (await client.get("/version")).json() == {"version": importlib.metadata.version("tinyvllm")}

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(ops_routes.importlib.metadata, "version", not_installed)
    assert (await client.get("/version")).json() == {"version": "0.0.0+unknown"}
