"""The router's /metrics, every name under `tinyvllm_router:`: requests and errors by instance, why each request went
where it went, how many instances are in each state (read from the registry at scrape time) and, with --tokenizer,
how many blocks each followed instance holds."""
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from tinyvllm.frontend.router.instance_registry import InstanceRegistry

PREFIX = "tinyvllm_router:"
NO_INSTANCE = "none"  # the instance label of a request no instance could take

# errors_total's reasons
CONNECT_FAILED = "connect_failed"  # the instance refused the connection or did not accept it in time
DROPPED = "dropped"  # the connection broke before the instance answered
UNAVAILABLE = "unavailable"  # it answered 503 (draining, busy, or no engine serving)
BROKEN_STREAM = "broken_stream"  # it failed after part of the answer had reached the client
NO_ROUTABLE = "no_routable_instance"


class _InstanceStates(Collector):
    def __init__(self, registry: InstanceRegistry):
        self.registry = registry

    def collect(self):
        family = GaugeMetricFamily(PREFIX + "instances", "Instances the router knows, by state.", labels=["state"])
        for state, count in self.registry.counts_by_state().items():
            family.add_metric([state], count)
        yield family


class _FollowedInstances(Collector):
    def __init__(self, streams):
        self.streams = streams

    def collect(self):
        family = GaugeMetricFamily(PREFIX + "kv_event_blocks", "Block hashes the router knows each instance to hold, "
                                   "for the instances whose KV events it follows (--tokenizer).", labels=["instance"])
        for url in sorted(self.streams.following):
            family.add_metric([url], self.streams.picker.known_blocks(url))
        yield family


class RouterMetrics:
    def __init__(self, instances: InstanceRegistry):
        disable_created_metrics()  # process-wide: no *_created series, as in the server's /metrics
        self.registry = CollectorRegistry()
        self.registry.register(_InstanceStates(instances))
        self.requests = Counter(PREFIX + "requests", "Proxied requests by the instance that answered and its status.",
                                ["instance", "status"], registry=self.registry)
        self.errors = Counter(PREFIX + "errors", "Failed attempts to proxy a request, by instance and reason.",
                              ["instance", "reason"], registry=self.registry)
        self.decisions = Counter(PREFIX + "routing_decisions",
                                 "Where requests were sent, and whether a cached prefix (cache), the load (load) or "
                                 "the turn (turn: --routing-policy round-robin) decided.",
                                 ["instance", "reason"], registry=self.registry)

    def follow(self, streams) -> None:
        """Reports what `streams` (kv_event_streams.KVEventStreams) know of each instance."""
        self.registry.register(_FollowedInstances(streams))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MergedFamilies(Collector):
    """Prometheus families parsed from each model's /metrics, one family per name (their series side by side: each
    carries its model_name)."""

    def __init__(self, texts: list[str]):
        self.texts = texts

    def collect(self):
        families = {}
        for text in self.texts:
            for family in text_string_to_metric_families(text):
                if family.name in families:
                    families[family.name].samples.extend(family.samples)
                else:
                    families[family.name] = family
        yield from families.values()
