"""Prometheus metrics under vLLM's names, so dashboards and inference gateways work unchanged.

Scheduler gauges and cumulative scheduler counters are read from engine.stats at scrape time; request counters
are fed by the serving glue.
"""
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)


class _EngineStatsCollector(Collector):
    def __init__(self, engine, model_name: str):
        self.engine = engine
        self.model_name = model_name

    def collect(self):
        stats = self.engine.stats
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", stats.num_running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_usage),
        ):
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], float(value))
            yield family
        # The scheduler keeps these cumulative, so they are counters even though they are read, not incremented.
        for name, doc, value in (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             stats.prefix_cache_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             stats.prefix_cache_hits),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats.num_preemptions),
        ):
            family = CounterMetricFamily(name, doc, labels=["model_name"])  # exposed as <name>_total
            family.add_metric([self.model_name], float(value))
            yield family


class FrontendMetrics:
    def __init__(self, engine, model_name: str):
        disable_created_metrics()  # process-wide: drop the *_created series, as vLLM does
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(_EngineStatsCollector(engine, model_name))
        labels = ["model_name"]
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels,
                                     registry=self.registry).labels(model_name)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.",
                                         labels, registry=self.registry).labels(model_name)
        self.request_success = Counter("vllm:request_success", "Count of finished requests by finish reason.",
                                       labels + ["finished_reason"], registry=self.registry)
        self.time_to_first_token = Histogram("vllm:time_to_first_token_seconds", "Time to first token in seconds.",
                                             labels, buckets=_TTFT_BUCKETS, registry=self.registry).labels(model_name)
        self.e2e_latency = Histogram("vllm:e2e_request_latency_seconds", "End to end request latency in seconds.",
                                     labels, buckets=_E2E_BUCKETS, registry=self.registry).labels(model_name)

    def record_first_token(self, seconds: float) -> None:
        self.time_to_first_token.observe(seconds)

    def record_finished(self, prompt_tokens: int, generated_tokens: int, finish_reasons: list[str],
                        seconds: float) -> None:
        """One request: its prompt counted once, and one finished request per choice (n > 1), as vLLM counts
        each parallel sample."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated_tokens)
        for reason in finish_reasons:
            self.request_success.labels(self.model_name, reason).inc()
        self.e2e_latency.observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
