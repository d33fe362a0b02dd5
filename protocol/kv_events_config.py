"""--kv-events-config, spelled as vLLM's KVEventsConfig (a JSON object): whether and where the scheduler publishes
the KV-cache events external KV-aware routers read (llm-d's KV indexer, Dynamo's KV router; scheduler/kv_events.py).

The endpoints are ZMQ addresses, bound or connected by vLLM's rule (bound when the address has a wildcard ("*"),
"::", or is ipc://, else connected) with one difference: a loopback address (127.x, [::1], localhost) is bound too,
where vLLM would connect to it. Events carry the prompts' token ids, so tinyvllm binds them nowhere beyond loopback
(a wildcard is refused): subscribers on this machine or in the pod connect to the loopback or ipc:// address; to
reach an indexer elsewhere, connect to it (`tcp://kv-indexer:5557`: the indexer binds, as llm-d's does), which opens
no port here but sends the events unauthenticated to that host: name one you trust. The replay endpoint is always
bound, so loopback or ipc:// only. With data parallelism, engine r's tcp ports are the given ones + r (ipc addresses
get "_dp<r>"), as vLLM offsets them: keep the two ports more than --data-parallel-size apart.
"""
import dataclasses
from dataclasses import dataclass

from tinyvllm.protocol.knobs import parse_json_object
from tinyvllm.protocol.worker_auth import is_loopback

PUBLISHERS = ("null", "zmq")
_FIELDS = ("enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm", "topic",
           "max_queue_size")  # vLLM's publisher thread's queue: tinyvllm publishes from its loop, and ignores it


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = "zmq"  # vLLM: "zmq" when events are enabled, "null" (publish nothing) otherwise
    endpoint: str = "tcp://127.0.0.1:5557"  # vLLM's default binds tcp://*:5557: every interface
    replay_endpoint: str | None = None  # a ROUTER: a subscriber sends a start sequence number, gets what followed
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's high-water mark (messages queued per slow subscriber, then dropped)
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher not in PUBLISHERS:
            raise ValueError(f"--kv-events-config: unknown publisher {self.publisher!r}; known: {', '.join(PUBLISHERS)}")
        if self.buffer_steps < 1 or self.hwm < 0:
            raise ValueError("--kv-events-config: buffer_steps must be at least 1 and hwm at least 0")
        if binds(self.endpoint) and not _local(self.endpoint):
            raise ValueError(f"--kv-events-config: endpoint {self.endpoint} would publish the prompts' token ids on "
                             "every interface: bind a loopback or ipc:// address, or connect to the subscriber "
                             "(tcp://HOST:PORT without a wildcard; it binds)")
        if self.replay_endpoint is not None and not _local(self.replay_endpoint):
            raise ValueError(f"--kv-events-config: replay_endpoint {self.replay_endpoint} is bound: it must be a "
                             "loopback or ipc:// address")

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def for_rank(self, data_parallel_rank: int) -> "KVEventsConfig":
        """This config as data-parallel engine `data_parallel_rank` uses it (its own ports)."""
        return dataclasses.replace(self, endpoint=offset_endpoint(self.endpoint, data_parallel_rank),
                                   replay_endpoint=offset_endpoint(self.replay_endpoint, data_parallel_rank))


def binds(endpoint: str) -> bool:
    """vLLM's rule (an address with a wildcard, "::" or ipc:// is bound; any other is connected to), and a loopback
    address is bound too."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith("ipc://") or is_loopback(endpoint)


def ipv6(endpoint: str) -> bool:
    """A tcp address whose host is bracketed: its socket needs ZMQ's IPV6 option."""
    return endpoint.startswith("tcp://[")


def _local(endpoint: str) -> bool:
    return "*" not in endpoint and is_loopback(endpoint)


def overlapping_ports(config: KVEventsConfig, engines: int) -> bool:
    """Whether engines 0 .. engines - 1 (each adding its rank to both ports) would give two sockets one tcp port."""
    ports = [int(e.rsplit(":", 1)[1]) for e in (config.endpoint, config.replay_endpoint) if e and e.startswith("tcp://")]
    return len(ports) == 2 and abs(ports[0] - ports[1]) < engines


def offset_endpoint(endpoint: str | None, data_parallel_rank: int) -> str | None:
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        host, port = endpoint.rsplit(":", 1)
        return f"{host}:{int(port) + data_parallel_rank}"
    return f"{endpoint}_dp{data_parallel_rank}"


def parse_kv_events_config(text: str | dict | None) -> KVEventsConfig | None:
    """The --kv-events-config JSON (or its dict) -> a KVEventsConfig (None: no events); ValueError if it is wrong."""
    if not text:
        return None
    fields = parse_json_object(text, "--kv-events-config", _FIELDS)
    if fields.get("publisher") is None:
        fields["publisher"] = "zmq" if fields.get("enable_kv_cache_events") else "null"
    for name, kind in (("enable_kv_cache_events", bool), ("buffer_steps", int), ("hwm", int), ("topic", str),
                       ("endpoint", str), ("publisher", str)):
        if name in fields and (not isinstance(fields[name], kind) or kind is int and isinstance(fields[name], bool)):
            raise ValueError(f"--kv-events-config: {name} must be a {kind.__name__}")
    if fields.get("replay_endpoint") is not None and not isinstance(fields["replay_endpoint"], str):
        raise ValueError("--kv-events-config: replay_endpoint must be a string")
    for name in ("endpoint", "replay_endpoint"):
        if isinstance(fields.get(name), str) and not fields[name].startswith(("tcp://", "ipc://")):
            raise ValueError(f"--kv-events-config: {name} must be a tcp:// or ipc:// address (the scheduler is a "
                             "process of its own)")
    fields.pop("max_queue_size", None)
    config = KVEventsConfig(**fields)
    return config if config.publishes else None
