"""Prefix-cache hits in usage (prompt_tokens_details.cached_tokens) and the scheduler counters on /metrics."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app_harness import MODEL, client_for, make_app, parse_sse

pytestmark = pytest.mark.anyio

LABEL = (("model_name", MODEL),)


@pytest.fixture
def served():
    app, engine, _ = make_app(num_cached_tokens=2)
    return client_for(app), engine


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": 2}),
])
async def test_cached_tokens_in_usage(served, path, body):
    client, _ = served
    usage = (await client.post(path, json=body)).json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 2}
    *_, usage_chunk, done = parse_sse((await client.post(path, json={
        **body, "stream": True, "stream_options": {"include_usage": True}})).text)
    assert done == "[DONE]" and usage_chunk["usage"] == usage


async def test_cached_tokens_are_zero_without_a_hit():
    app, _, _ = make_app()
    usage = (await client_for(app).post("/v1/completions", json={"prompt": "Hi"})).json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_scheduler_counters_are_exposed(served):
    client, engine = served
    engine.num_preemptions = 5
    await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    await client.post("/v1/completions", json={"prompt": "Hey", "max_tokens": 2})
    families = {f.name: f for f in text_string_to_metric_families((await client.get("/metrics")).text)}
    for name, value in (("vllm:prefix_cache_queries", 3 + 4), ("vllm:prefix_cache_hits", 2 + 2),
                        ("vllm:num_preemptions", 5)):
        family = families[name]
        assert family.type == "counter"
        (sample,) = family.samples
        assert (sample.name, sample.labels, sample.value) == (name + "_total", {**dict(LABEL), "engine": "0"}, value)


async def test_request_success_counts_every_choice(served):
    client, _ = served
    await client.post("/v1/completions", json={"prompt": "Hi", "n": 3, "max_tokens": 4})
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families((await client.get("/metrics")).text)
               for s in family.samples}
    assert samples[("vllm:request_success_total", (("finished_reason", "length"), *LABEL))] == 3
    assert samples[("vllm:prompt_tokens_total", LABEL)] == 3  # one prompt, shared by the choices
    assert samples[("vllm:generation_tokens_total", LABEL)] == 3 * 4
    assert samples[("vllm:e2e_request_latency_seconds_count", LABEL)] == 1
