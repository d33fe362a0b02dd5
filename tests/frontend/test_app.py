"""The OpenAI routes end to end through the ASGI app, with a fake engine and a one-char-per-token tokenizer."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app_harness import MAX_MODEL_LEN, MODEL, REPLY, client_for, make_app

pytestmark = pytest.mark.anyio


async def test_completion_non_streamed_shape_and_usage(served):
    client, engine, tok = served
    r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi"})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["id"].startswith("cmpl-") and len(body["id"]) > 10
    assert body["object"] == "text_completion" and body["model"] == MODEL and isinstance(body["created"], int)
    assert body["choices"] == [{"index": 0, "text": REPLY, "logprobs": None, "finish_reason": "stop",
                                "stop_reason": None}]
    # prompt: BOS + 2 chars; completion: the reply + EOS
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": len(REPLY) + 1,
                             "total_tokens": 3 + len(REPLY) + 1, "prompt_tokens_details": {"cached_tokens": 0}}
    assert engine.requests[body["id"]].prompt_token_ids == tok.encode("Hi")


async def test_completion_default_and_explicit_max_tokens(served):
    client, engine, _ = served
    r = await client.post("/v1/completions", json={"prompt": "Hi", "ignore_eos": True})  # model may be omitted
    assert r.json()["usage"]["completion_tokens"] == 16 and r.json()["choices"][0]["finish_reason"] == "length"
    r = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 5})
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("Hello", "length")
    assert r.json()["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("prompt", [[1, 75, 108], ["Hi"], [[1, 75, 108]]])
async def test_completion_prompt_forms(served, prompt):
    client, engine, tok = served
    r = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert engine.requests[r.json()["id"]].prompt_token_ids == tok.encode("Hi")


async def test_sampling_fields_reach_the_engine(served):
    client, engine, _ = served
    r = await client.post("/v1/completions", json={
        "prompt": "Hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 1234,
        "stop_token_ids": [500], "ignore_eos": True, "some_unknown_field": {"x": 1}})
    assert r.status_code == 200, r.text
    sent = engine.requests[r.json()["id"]]
    s = sent.sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens, s.seed, s.stop_token_ids, s.ignore_eos) == \
        (0.5, 0.9, 40, 7, 1234, [500], True)
    assert sent.eos_token_ids == [2]


async def test_stop_token_id_ends_text_without_showing_it(served):
    client, _, tok = served
    o = tok.encode("o", add_special_tokens=False)[0]
    r = await client.post("/v1/completions", json={"prompt": "Hi", "stop_token_ids": [o]})
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == ("Hell", "stop", o)
    assert r.json()["usage"]["completion_tokens"] == 5


async def test_stop_string_cuts_output_and_aborts_request(served):
    client, engine, _ = served
    r = await client.post("/v1/completions", json={"prompt": "Hi", "stop": ["zzz", "wor"], "ignore_eos": True,
                                                   "max_tokens": 40})
    body = r.json()
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == ("Hello ", "stop", "wor")
    assert body["id"] in engine.aborted and engine.num_active == 0
    assert body["usage"]["completion_tokens"] == len("Hello wor")


async def test_chat_non_streamed_shape_and_default_max_tokens(served):
    client, engine, tok = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    prompt_ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"].startswith(REPLY)
    assert (choice["index"], choice["logprobs"], choice["finish_reason"], choice["stop_reason"]) == \
        (0, None, "length", None)
    assert engine.requests[body["id"]].prompt_token_ids == prompt_ids
    # no max_tokens in chat: the rest of the context
    assert body["usage"]["completion_tokens"] == MAX_MODEL_LEN - len(prompt_ids)
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)


async def test_chat_content_parts_and_max_completion_tokens(served):
    client, engine, tok = served
    parts = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": parts}], "max_tokens": 9, "max_completion_tokens": 4})
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "Hell"
    assert engine.requests[body["id"]].prompt_token_ids == \
        tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi\nthere"}]), add_special_tokens=False)


async def test_engine_error_is_a_500_and_server_keeps_serving():
    app, engine, _ = make_app(fail_after=3)
    client = client_for(app)
    r = await client.post("/v1/completions", json={"prompt": "Hi"})
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "InternalServerError" and err["code"] == 500 and "worker exploded" in err["message"]
    assert (await client.get("/health")).status_code == 200


async def test_dead_engine_gives_503_and_unhealthy(served):
    client, engine, _ = served
    assert (await client.get("/health")).status_code == 200
    engine.mark_dead("scheduler process exited")
    r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 503 and r.json()["error"]["code"] == 503
    h = await client.get("/health")
    assert h.status_code == 503


async def test_models_and_health(served):
    client, _, _ = served
    r = await client.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and len(body["data"]) == 1
    card = body["data"][0]
    assert set(card) == {"id", "object", "created", "owned_by", "root", "parent", "max_model_len"}
    assert (card["id"], card["object"], card["owned_by"], card["parent"], card["max_model_len"]) == \
        (MODEL, "model", "tinyvllm", None, MAX_MODEL_LEN)
    h = await client.get("/health")
    assert h.status_code == 200 and h.content == b""


def _samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_metrics(served):
    client, engine, _ = served
    await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4})
    await client.post("/v1/completions", json={"prompt": "Hi"})
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = _samples(r.text)
    label = (("model_name", MODEL),)
    engine_label = (("engine", "0"), *label)  # the scheduler's metrics name their engine (a data-parallel replica)
    assert samples[("vllm:num_requests_running", engine_label)] == 0
    assert samples[("vllm:num_requests_waiting", engine_label)] == 0
    assert samples[("vllm:kv_cache_usage_perc", engine_label)] == pytest.approx(0.25)
    assert samples[("vllm:prompt_tokens_total", label)] == 6
    assert samples[("vllm:generation_tokens_total", label)] == 4 + len(REPLY) + 1
    assert samples[("vllm:request_success_total", (("finished_reason", "length"), *label))] == 1
    assert samples[("vllm:request_success_total", (("finished_reason", "stop"), *label))] == 1
    assert samples[("vllm:time_to_first_token_seconds_count", label)] == 2
