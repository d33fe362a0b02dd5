"""/metrics: vLLM's names and types, the per-request histograms, and the queue-time hook the scheduler will feed."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app_harness import MODEL, client_for, make_app
from tinyvllm.frontend.api.metrics import FrontendMetrics, one_two_five_buckets

pytestmark = pytest.mark.anyio

LABEL = (("model_name", MODEL),)
HISTOGRAMS = ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_prompt_tokens",
              "vllm:request_generation_tokens", "vllm:request_params_n", "vllm:request_params_max_tokens"]


@pytest.fixture
def served():
    app, engine, _ = make_app()
    return client_for(app), app


async def scrape(client) -> tuple[dict, dict]:
    r = await client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(r.text))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    return samples, {f.name: f.type for f in families}


async def test_every_family_has_vllms_name_and_type(served):
    client, _ = served
    _, types = await scrape(client)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:cpu_cache_usage_perc"):
        assert types[name] == "gauge"
    for name in ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success", "vllm:prefix_cache_queries",
                 "vllm:prefix_cache_hits", "vllm:num_preemptions", "tinyvllm:computed_tokens",
                 "tinyvllm:swapped_out_blocks", "tinyvllm:swapped_in_blocks"):
        assert types[name] == "counter"
    for name in HISTOGRAMS:
        assert types[name] == "histogram"


async def test_one_request_moves_every_request_metric(served):
    client, _ = served
    r = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "n": 2})
    assert r.status_code == 200
    samples, _ = await scrape(client)

    def value(name):
        return samples[(name, LABEL)]

    assert value("vllm:time_to_first_token_seconds_count") == 1
    assert value("vllm:inter_token_latency_seconds_count") == 2 * 3  # per choice, between its 4 tokens
    assert value("vllm:e2e_request_latency_seconds_count") == 1
    assert value("vllm:request_params_n_sum") == 2 and value("vllm:request_params_max_tokens_sum") == 4
    assert value("vllm:request_prompt_tokens_sum") == 3  # <s> H i
    assert value("vllm:request_generation_tokens_sum") == 8
    assert value("vllm:request_queue_time_seconds_count") == 0  # fed only by the scheduler's hook


async def test_streamed_requests_are_timed_too(served):
    client, _ = served
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": True})
    assert r.status_code == 200
    samples, _ = await scrape(client)
    assert samples[("vllm:inter_token_latency_seconds_count", LABEL)] == 4
    assert samples[("vllm:generation_tokens_total", LABEL)] == 5


async def test_queue_time_hook(served):
    client, app = served
    metrics: FrontendMetrics = app.state.metrics
    metrics.record_queue_time(0.4)
    metrics.record_queue_time(3.0)
    samples, _ = await scrape(client)
    assert samples[("vllm:request_queue_time_seconds_count", LABEL)] == 2
    assert samples[("vllm:request_queue_time_seconds_sum", LABEL)] == pytest.approx(3.4)
    assert samples[("vllm:request_queue_time_seconds_bucket", (("le", "0.5"), *LABEL))] == 1
    assert samples[("vllm:request_queue_time_seconds_bucket", (("le", "5.0"), *LABEL))] == 2


def test_token_count_buckets_go_one_two_five():
    assert one_two_five_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert one_two_five_buckets(512)[-1] == 500


def test_two_apps_keep_separate_registries():
    first, _, _ = make_app()
    second, _, _ = make_app()
    first.state.metrics.record_queue_time(1.0)
    text = second.state.metrics.render()[0].decode()
    assert 'vllm:request_queue_time_seconds_count{model_name="%s"} 0.0' % MODEL in text


def test_swap_space_usage_and_swapped_blocks_are_exposed():
    from types import SimpleNamespace
    from tinyvllm.protocol.messages import SchedulerStats
    stats = SchedulerStats(num_tokens_computed=90, num_free_swap_slots=1, num_swap_slots=4, num_swapped_out_blocks=7,
                           num_swapped_in_blocks=4)
    text = FrontendMetrics(SimpleNamespace(stats=stats), MODEL).render()[0].decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["vllm:cpu_cache_usage_perc"] == 0.75 and samples["tinyvllm:computed_tokens_total"] == 90
    assert samples["tinyvllm:swapped_out_blocks_total"] == 7 and samples["tinyvllm:swapped_in_blocks_total"] == 4
