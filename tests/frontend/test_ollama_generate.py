"""/api/generate and /api/chat through the ASGI app with the fake engine: NDJSON, options, context, errors."""
import pytest

from app_harness import MODEL, REPLY
from ollama_harness import MAX_MODEL_LEN, make_ollama_app, only_request, parse_ndjson

pytestmark = pytest.mark.anyio
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


@pytest.fixture
def served(tmp_path):
    return make_ollama_app(tmp_path)


def assert_final(final: dict, prompt_len: int, eval_count: int, done_reason: str = "stop"):
    assert final["done"] is True and final["done_reason"] == done_reason
    assert final["prompt_eval_count"] == prompt_len and final["eval_count"] == eval_count
    assert all(isinstance(final[k], int) and final[k] >= 0 for k in DURATIONS)
    assert final["total_duration"] >= final["load_duration"] + final["prompt_eval_duration"]
    assert final["created_at"].endswith("Z") and "T" in final["created_at"]


async def test_generate_streams_ndjson_and_returns_context(served):
    client, engine, tok = served
    r = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi"})
    assert r.status_code == 200
    lines = parse_ndjson(r)
    *chunks, final = lines
    assert all(c["done"] is False and c["model"] == MODEL and set(c) == {"model", "created_at", "response", "done"}
               for c in chunks)
    assert "".join(c["response"] for c in chunks) == REPLY and final["response"] == ""
    req = only_request(engine)
    assert req.prompt_token_ids == tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi"}]), False)
    assert final["context"] == req.prompt_token_ids + tok.encode(REPLY, False) + tok.eos_token_ids
    assert_final(final, len(req.prompt_token_ids), len(REPLY) + 1)


async def test_generate_without_streaming_and_context_continuation(served):
    client, engine, tok = served
    first = (await client.post("/api/generate", json={"model": MODEL + ":latest", "prompt": "Hi",
                                                      "stream": False})).json()
    assert first["response"] == REPLY and first["model"] == MODEL + ":latest" and first["done"] is True
    second = await client.post("/api/generate", json={"model": MODEL, "prompt": "More", "stream": False,
                                                      "context": first["context"]})
    assert second.status_code == 200
    prompt_ids = engine.requests[list(engine.requests)[1]].prompt_token_ids
    assert prompt_ids[:len(first["context"])] == first["context"]
    assert prompt_ids[len(first["context"]):] == tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "More"}]), False)


async def test_options_map_to_sampling_params(served):
    client, engine, _ = served
    options = {"temperature": 0.3, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 42, "num_predict": 3,
               "stop": ["xyz"], "repeat_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.25,
               "num_ctx": 4096, "num_gpu": 1, "mirostat": 0, "not_an_option": True}
    r = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False,
                                                 "options": options})
    body = r.json()
    assert r.status_code == 200 and body["done_reason"] == "length" and body["eval_count"] == 3
    s = only_request(engine).sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed, s.max_tokens) == (0.3, 0.5, 7, 0.1, 42, 3)
    assert (s.repetition_penalty, s.presence_penalty, s.frequency_penalty) == (1.2, 0.5, 0.25)


async def test_ollama_defaults_and_num_predict_until_context_end(served):
    client, engine, _ = served
    r = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False,
                                                 "options": {"seed": -1, "num_predict": -1}})
    assert r.status_code == 200
    req = only_request(engine)
    s = req.sampling
    assert (s.temperature, s.top_k, s.top_p, s.seed) == (0.8, 40, 0.9, None)
    assert s.max_tokens == MAX_MODEL_LEN - len(req.prompt_token_ids)


async def test_stop_strings_end_the_reply(served):
    client, _, _ = served
    body = (await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False,
                                                     "options": {"stop": ["wor"]}})).json()
    assert body["response"] == "Hello " and body["done_reason"] == "stop"


async def test_raw_system_and_template(served):
    client, engine, tok = served
    raw = (await client.post("/api/generate", json={"model": MODEL, "prompt": "[INST]Hi", "raw": True,
                                                    "stream": False})).json()
    assert "context" not in raw and only_request(engine).prompt_token_ids == tok.encode("[INST]Hi")
    engine.requests.clear()
    template = "{{ if .System }}S:{{ .System }}\n{{ end }}U:{{ .Prompt }}\nA:{{ .Response }}</s>"
    r = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "system": "Be brief",
                                                 "template": template, "stream": False})
    assert r.status_code == 200
    assert only_request(engine).prompt_token_ids == tok.encode("S:Be brief\nU:Hi\nA:")
    bad = await client.post("/api/generate", json={"model": MODEL, "prompt": "x", "raw": True, "system": "s"})
    assert bad.status_code == 400 and "raw mode" in bad.json()["error"]


async def test_empty_prompt_loads_and_keep_alive_zero_unloads(served):
    client, engine, _ = served
    load = (await client.post("/api/generate", json={"model": MODEL})).json()
    assert (load["done"], load["done_reason"], load["response"]) == (True, "load", "")
    unload = (await client.post("/api/chat", json={"model": MODEL, "messages": [], "keep_alive": 0})).json()
    assert unload["done_reason"] == "unload" and unload["message"] == {"role": "assistant", "content": ""}
    assert not engine.requests


async def test_chat_streamed_and_not(served):
    client, engine, tok = served
    messages = [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}]
    lines = parse_ndjson(await client.post("/api/chat", json={"model": MODEL, "messages": messages}))
    *chunks, final = lines
    assert all(c["message"]["role"] == "assistant" and not c["done"] for c in chunks)
    assert "".join(c["message"]["content"] for c in chunks) == REPLY
    assert final["message"] == {"role": "assistant", "content": ""} and "context" not in final
    assert_final(final, len(tok.encode(tok.apply_chat_template(messages), False)), len(REPLY) + 1)
    whole = (await client.post("/api/chat", json={"model": MODEL, "messages": messages, "stream": False})).json()
    assert whole["message"] == {"role": "assistant", "content": REPLY} and whole["done_reason"] == "stop"


async def test_format_becomes_a_grammar_for_the_engine(served):
    # enforcement is the worker's (tests/e2e/test_structured_output.py): here the request carries the grammar
    client, engine, tok = served
    r = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "format": "json", "stream": False})
    assert r.status_code == 200, r.text
    request = only_request(engine)
    assert "valid JSON object" in tok.decode(request.prompt_token_ids)  # the prompt asks for JSON too
    assert request.sampling.grammar and "json_schema" in request.sampling.grammar


async def test_format_that_is_no_schema_is_a_400_naming_the_problem(served):
    client, _, _ = served
    r = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False,
                                                 "format": {"type": "object", "required": 5}})
    assert r.status_code == 400 and "format is invalid" in r.json()["error"], r.text
    bad = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "format": "yaml"})
    assert bad.status_code == 400 and "invalid format" in bad.json()["error"]


@pytest.mark.parametrize("path,body,status,fragment", [
    ("/api/generate", {"prompt": "Hi"}, 400, "model is required"),
    ("/api/generate", {"model": "nope", "prompt": "Hi"}, 404, 'model "nope" not found, try pulling it first'),
    ("/api/chat", {"model": "nope", "messages": []}, 404, "not found"),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "images": ["aGk="]}, 400, "images are not supported"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "Hi", "images": ["aGk="]}]}, 400,
     "images are not supported"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "wizard", "content": "Hi"}]}, 400, "'role'"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                   "tools": [{"type": "function"}]}, 400, "tools[0].function' is required"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                   "tools": [{"type": "function", "function": {"name": "a b"}}]}, 400, "tools[0].function.name"),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "suffix": "x"}, 400, "suffix"),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "think": True}, 400, "thinking"),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "options": {"temperature": "hot"}}, 400, "temperature"),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "options": {"top_p": 0}}, 400, "top_p"),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "context": [1, -5]}, 400, "context"),
    ("/api/generate", {"model": MODEL, "prompt": "Hi" * 200}, 400, "maximum context length"),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "template": "{{ call .X }}"}, 400, "unsupported"),
])
async def test_bad_requests(served, path, body, status, fragment):
    client, engine, _ = served
    r = await client.post(path, json=body)
    assert r.status_code == status and set(r.json()) == {"error"} and fragment in r.json()["error"], r.text
    assert not engine.requests


async def test_body_errors(served):
    client, _, _ = served
    for content in (b"", b"{not json", b"[1, 2]"):
        r = await client.post("/api/generate", content=content)
        assert r.status_code == 400 and "error" in r.json()
    r = await client.post("/api/generate", content=b"x" * (65 * 1024))
    assert r.status_code == 413


async def test_engine_errors(tmp_path):
    client, _, _ = make_ollama_app(tmp_path, fail_after=0)
    r = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi"})
    assert r.status_code == 500 and "worker exploded" in r.json()["error"]
    client, _, _ = make_ollama_app(tmp_path, fail_after=3)
    lines = parse_ndjson(await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi"}))
    assert [line.get("response") for line in lines[:-1]] == list(REPLY[:3])
    assert "worker exploded" in lines[-1]["error"]
    client, engine, _ = make_ollama_app(tmp_path)
    engine.mark_dead("scheduler exited")
    r = await client.post("/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 503 and "scheduler exited" in r.json()["error"]
