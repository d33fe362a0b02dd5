"""Prometheus metrics under vLLM's names, so dashboards and inference gateways work unchanged.

Scheduler gauges and cumulative scheduler counters are read from each engine's stats at scrape time, labelled with
the engine (`engine="0"` .. D-1 with data-parallel replicas, as vLLM labels them; a restarted engine's counters
start again from zero, which Prometheus reads as a counter reset); request counters and
histograms are fed by the serving glue (first token, finished request), by ServedEngine (inter-token latency,
request parameters) and, for the queue time only the scheduler can see, by whoever calls record_queue_time.
"""
import time

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# vLLM's buckets (vllm/v1/metrics/loggers.py)
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
_REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                            240.0, 480.0, 960.0, 1920.0, 7680.0)
_N_BUCKETS = (1, 2, 5, 10, 20)


def one_two_five_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value, as vLLM buckets token counts."""
    buckets, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(buckets)
            buckets.append(m * scale)
        scale *= 10


def cache_config_info(ready) -> GaugeMetricFamily:
    """vLLM's info gauge of the KV cache's configuration (value 1; the facts are labels): its blocks per engine
    (num_gpu_blocks, whatever the device), their size in tokens and the dtype they store."""
    info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                             labels=["block_size", "cache_dtype", "num_gpu_blocks"])
    info.add_metric([str(ready.block_size), ready.kv_cache_dtype, str(ready.num_blocks)], 1.0)
    return info


def lora_requests_info(by_engine: dict) -> GaugeMetricFamily:
    """vLLM's vllm:lora_requests_info (what the Gateway API Inference Extension reads for adapter affinity): the
    adapters of running and waiting requests as comma-separated labels, valued the time of the reading."""
    info = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                             labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters", "engine"])
    for engine, stats in by_engine.items():
        info.add_metric([str(stats.max_loras), ",".join(stats.running_lora_adapters),
                         ",".join(stats.waiting_lora_adapters), engine], time.time())
    return info


class _EngineStatsCollector(Collector):
    def __init__(self, engine, model_name: str):
        self.engine = engine
        self.model_name = model_name

    def collect(self):
        by_engine = self.engine.stats_by_engine() if hasattr(self.engine, "stats_by_engine") else \
            {"0": self.engine.stats}
        gauges = (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", "num_running"),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "num_waiting"),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_usage"),
            ("vllm:cpu_cache_usage_perc", "CPU KV-cache usage (--swap-space). 1 means 100 percent usage.",
             "swap_usage"),
        )
        # The scheduler keeps these cumulative, so they are counters even though they are read, not incremented.
        counters = (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             "prefix_cache_queries"),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", "prefix_cache_hits"),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "num_preemptions"),
            ("tinyvllm:computed_tokens", "Tokens whose KV the workers computed: prompts, decodes and the recompute "
             "of preempted requests.", "num_tokens_computed"),
            ("tinyvllm:swapped_out_blocks", "KV blocks of preempted requests copied to CPU swap space.",
             "num_swapped_out_blocks"),
            ("tinyvllm:swapped_in_blocks", "KV blocks copied back from CPU swap space as their requests resumed.",
             "num_swapped_in_blocks"),
            ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", "spec_num_drafts"),
            ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", "spec_num_draft_tokens"),
            ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", "spec_num_accepted_tokens"),
        )
        for family_type, metrics in ((GaugeMetricFamily, gauges), (CounterMetricFamily, counters)):
            for name, doc, stat in metrics:
                family = family_type(name, doc, labels=["model_name", "engine"])  # a counter shows as <name>_total
                for engine, stats in by_engine.items():
                    family.add_metric([self.model_name, engine], float(getattr(stats, stat)))
                yield family
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft "
                                      "position.", labels=["model_name", "engine", "position"])
        for engine, stats in by_engine.items():
            for position, count in enumerate(stats.spec_accepted_per_pos):
                per_pos.add_metric([self.model_name, engine, str(position)], float(count))
        yield per_pos
        if any(stats.max_loras for stats in by_engine.values()):
            yield lora_requests_info(by_engine)
        if (ready := getattr(self.engine, "ready", None)) is not None:  # once the engine started
            yield cache_config_info(ready)


class _GateCollector(Collector):
    """The frontend's own queue (frontend/api/request_gate.py): vLLM has no names for these."""

    def __init__(self, gate, model_name: str):
        self.gate, self.model_name = gate, model_name

    def collect(self):
        waiting = GaugeMetricFamily("tinyvllm:num_requests_waiting_admission",
                                    "Generation requests accepted that have no output yet (reading, tokenizing, "
                                    "queued), the count --max-waiting-requests limits.", labels=["model_name"])
        waiting.add_metric([self.model_name], float(self.gate.waiting))
        rejected = CounterMetricFamily("tinyvllm:requests_rejected", "Generation requests answered 503 before any "
                                       "work, by reason (queue_full, shutting_down).", labels=["model_name", "reason"])
        for reason, count in self.gate.rejected.items():
            rejected.add_metric([self.model_name, reason], float(count))
        return [waiting, rejected]


class FrontendMetrics:
    def __init__(self, engine, model_name: str, max_model_len: int = 2048, gate=None):
        """gate: the app's RequestGate, whose queue and rejections are exported too."""
        disable_created_metrics()  # process-wide: drop the *_created series, as vLLM does
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(_EngineStatsCollector(engine, model_name))
        if gate is not None:
            self.registry.register(_GateCollector(gate, model_name))
        labels = ["model_name"]

        def counter(name: str, doc: str):
            return Counter(name, doc, labels, registry=self.registry).labels(model_name)

        def histogram(name: str, doc: str, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry).labels(model_name)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.request_success = Counter("vllm:request_success", "Count of finished requests by finish reason.",
                                       labels + ["finished_reason"], registry=self.registry)
        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds",
                                             "Histogram of time to first token in seconds.", _TTFT_BUCKETS)
        self.inter_token_latency = histogram("vllm:inter_token_latency_seconds",
                                             "Histogram of inter-token latency in seconds.", _ITL_BUCKETS)
        self.e2e_latency = histogram("vllm:e2e_request_latency_seconds",
                                     "Histogram of e2e request latency in seconds.", _REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.", _REQUEST_LATENCY_BUCKETS)
        token_buckets = one_two_five_buckets(max_model_len)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               token_buckets)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.", token_buckets)
        self.request_params_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.",
                                          _N_BUCKETS)
        self.request_params_max_tokens = histogram("vllm:request_params_max_tokens",
                                                   "Histogram of the max_tokens request parameter.", token_buckets)
        # Plain running totals for /dashboard's charts (frontend/api/dashboard_snapshot.py), which take their deltas.
        self.streamed_tokens = 0
        self.first_token_seconds_sum, self.first_token_count = 0.0, 0

    def record_request_params(self, n: int, max_tokens: int) -> None:
        self.request_params_n.observe(n)
        self.request_params_max_tokens.observe(max_tokens)

    def record_queue_time(self, seconds: float) -> None:
        """Arrival to first scheduling of one request: only the scheduler knows it, so it is fed from outside."""
        self.queue_time.observe(seconds)

    def record_first_token(self, seconds: float) -> None:
        self.time_to_first_token.observe(seconds)
        self.first_token_seconds_sum += seconds
        self.first_token_count += 1

    def record_streamed_tokens(self, count: int) -> None:
        """Tokens as the engine produced them (generation_tokens counts a request's only when it finishes)."""
        self.streamed_tokens += count

    def record_inter_token_latency(self, seconds: float) -> None:
        self.inter_token_latency.observe(seconds)

    def record_finished(self, prompt_tokens: int, generated_tokens: int, finish_reasons: list[str],
                        seconds: float) -> None:
        """One request: its prompt counted once, and one finished request per choice (n > 1), as vLLM counts
        each parallel sample."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated_tokens)
        for reason in finish_reasons:
            self.request_success.labels(self.model_name, reason).inc()
        self.e2e_latency.observe(seconds)
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(generated_tokens)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
