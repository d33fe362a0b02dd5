"""--kv-events-config, spelled as vLLM's KVEventsConfig (a JSON object): whether and where the scheduler publishes
the KV-cache events external KV-aware routers read (llm-d's KV indexer, Dynamo's KV router; scheduler/kv_events.py).

The endpoints are ZMQ addresses, bound or connected by vLLM's rule: bound when the address has a wildcard ("*"),
"::", or is ipc:// or inproc://, else connected. Events carry the prompts' token ids, so a bound tcp endpoint must be
loopback (a subscriber on this machine, or a sidecar in the pod); to reach an indexer elsewhere, connect to it
(`tcp://kv-indexer:5557`: the indexer binds, as llm-d's does), which opens no port here. The replay endpoint is
always bound, so loopback or ipc:// only. With data parallelism, engine r's tcp ports are the given ones + r (ipc
and inproc addresses get "_dp<r>"), as vLLM offsets them.
"""
import dataclasses
from dataclasses import dataclass

from tinyvllm.protocol.knobs import parse_json_object
from tinyvllm.protocol.worker_auth import is_loopback

PUBLISHERS = ("null", "zmq")
_FIELDS = ("enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm", "topic")


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
    """vLLM's rule: an address with a wildcard, "::", ipc:// or inproc:// is bound; any other is connected to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _local(endpoint: str) -> bool:
    return "*" not in endpoint and is_loopback(endpoint)


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
        if isinstance(fields.get(name), str) and not fields[name].startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"--kv-events-config: {name} must be a tcp://, ipc:// or inproc:// address")
    config = KVEventsConfig(**fields)
    return config if config.publishes else None
