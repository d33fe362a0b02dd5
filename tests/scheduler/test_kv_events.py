"""KV-cache events (--kv-events-config): the block pool's stores and evictions, published as vLLM frames them.

A subscriber that applies every event rebuilds exactly the pool's set of cached hashes, after every step of a run
with prefix hits, evictions under pressure, preemption and aborts; the bytes decode with vLLM's own event structs
(mirrored below from vllm/distributed/kv_events.py, decoded by msgspec as vLLM's consumers do); a late subscriber
catches up through the replay socket."""
import msgspec
import pytest
import zmq

from fake_worker import make_request, make_scheduler, step
from tinyvllm.protocol.kv_events import external_hash
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.kv_events_config import KVEventsConfig, binds, parse_kv_events_config
from tinyvllm.protocol.block_hash import root_hash
from tinyvllm.scheduler.kv_events import END_OF_REPLAY, KVEventPublisher


# vLLM's structs (vllm/distributed/kv_events.py at 0181ea3): maps, each event tagged by its class name under "type"
class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODE = msgspec.msgpack.Decoder(KVEventBatch)


def cached_hashes(scheduler) -> set[int]:
    return {external_hash(b.block_hash) for b in scheduler.kv_cache_manager.pool.blocks if b.block_hash is not None}


class Subscriber:
    """What an external router knows: every event applied, in order."""

    def __init__(self):
        self.hashes: set[int] = set()
        self.ever: set[int] = set()  # every hash stored so far
        self.first_blocks = 0  # stores of a prompt's first block (no parent)
        self.counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}

    def apply(self, batch: KVEventBatch) -> None:
        for event in batch.events:
            self.counts[type(event).__name__] += 1
            if isinstance(event, BlockStored):
                assert len(event.token_ids) == len(event.block_hashes) * event.block_size and event.medium == "GPU"
                # a chain's parent was stored before it (the scheduler registers a request's blocks in order)
                assert event.parent_block_hash is None or event.parent_block_hash in self.ever
                self.first_blocks += event.parent_block_hash is None
                for h in event.block_hashes:
                    assert h not in self.hashes, "stored twice without a removal"
                    self.hashes.add(h)
                    self.ever.add(h)
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    self.hashes.remove(h)  # a removal of something never stored fails here
            else:
                self.hashes.clear()


def subscribe(ctx: zmq.Context, endpoint: str, topic: bytes = b"") -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.setsockopt(zmq.IPV6, endpoint.startswith("tcp://["))
    sub.connect(endpoint)
    return sub


def first_batch(sub: zmq.Socket, publisher: KVEventPublisher) -> list[bytes]:
    """PUB drops what it sends before the subscription reaches it ("slow joiner"): empty batches until one arrives."""
    for _ in range(200):
        if sub.poll(50):
            return sub.recv_multipart()
        publisher.publish([])
    raise AssertionError("no batch reached the subscriber")


def receive_up_to(sub: zmq.Socket, subscriber: Subscriber, seq: list[int], published: int) -> None:
    """Applies batches seq[0] .. published - 1, which must come in order, none lost."""
    while seq[0] < published:
        assert sub.poll(5000), f"batch {seq[0]} did not arrive"
        topic, number, payload = sub.recv_multipart()
        assert topic == b"kv" and int.from_bytes(number, "big") == seq[0], "a batch lost or out of order"
        seq[0] += 1
        subscriber.apply(DECODE.decode(payload))


def test_a_subscriber_rebuilds_the_pool_through_hits_evictions_preemption_and_aborts(tmp_path):
    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/events"
    sched, worker = make_scheduler(max_num_seqs=4, max_num_batched_tokens=32, block_size=4, num_blocks=16)
    publisher = KVEventPublisher(ctx, KVEventsConfig(enable_kv_cache_events=True, endpoint=endpoint, topic="kv"), 0)
    sched.kv_cache_manager.pool.events = []
    sub = subscribe(ctx, endpoint, b"kv")
    mirror, seq = Subscriber(), [0]
    try:
        seq[0] = int.from_bytes(first_batch(sub, publisher)[1], "big") + 1
        shared = make_request("shared", 18).prompt_token_ids
        salted = make_request("salted", 10, max_tokens=2)
        salted.cache_salt = "tenant-1"  # its first block chains from a salted root, which is no block: parent nil
        script = [salted, make_request("a", 18, max_tokens=6, prompt=shared), make_request("b", 22, max_tokens=6),
                  make_request("c", 18, max_tokens=4, prompt=shared),  # a prefix hit on a's blocks
                  make_request("d", 20, max_tokens=24), make_request("e", 20, max_tokens=24),  # pressure: evictions,
                  make_request("f", 18, max_tokens=24)]                                          # preemption
        for i, req in enumerate(script):
            sched.add_request(req)
            if req.req_id == "e":
                sched.abort(["b"])
            for _ in range(3 if i < len(script) - 1 else 200):
                if not sched.has_unfinished():
                    break
                step(sched, worker)
                if sched.kv_cache_manager.pool.events:
                    publisher.publish(sched.kv_cache_manager.pool.events)
                    sched.kv_cache_manager.pool.events = []
                receive_up_to(sub, mirror, seq, publisher.next_seq)
                assert mirror.hashes == cached_hashes(sched)
        assert not sched.has_unfinished()
        assert sched.prefix_cache_hits > 0 and sched.num_preemptions > 0
        assert mirror.counts["BlockStored"] > 0 and mirror.counts["BlockRemoved"] > 0
        assert mirror.first_blocks >= 4  # a parent that was never stored fails in Subscriber.apply
        assert not {external_hash(root_hash(salt)) for salt in (None, "tenant-1")} & mirror.ever
    finally:
        publisher.close()
        sub.close(linger=0)
        ctx.destroy(linger=0)


def test_a_late_subscriber_catches_up_through_the_replay_socket(tmp_path):
    ctx = zmq.Context()
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"ipc://{tmp_path}/events",
                            replay_endpoint=f"ipc://{tmp_path}/replay", buffer_steps=3)
    sched, worker = make_scheduler(block_size=4, num_blocks=32)
    publisher = KVEventPublisher(ctx, config, 0)  # its first batch, AllBlocksCleared, reaches no subscriber
    sched.kv_cache_manager.pool.events = []
    try:
        for name in ("a", "b", "c"):
            sched.add_request(make_request(name, 12, max_tokens=2))
            while sched.has_unfinished():
                step(sched, worker)
            publisher.publish(sched.kv_cache_manager.pool.events)
            sched.kv_cache_manager.pool.events = []
        replay = ctx.socket(zmq.DEALER)  # a DEALER takes every reply (a REQ only the first)
        replay.connect(config.replay_endpoint)
        replay.send_multipart((b"", (1).to_bytes(8, "big")))  # batch 0 is past buffer_steps: 1, 2 and 3 are kept
        seen, mirror = [], Subscriber()
        while True:
            assert replay.poll(5000)
            empty, seq, payload = replay.recv_multipart()
            if seq == END_OF_REPLAY:
                break
            seen.append(int.from_bytes(seq, "big"))
            mirror.apply(DECODE.decode(payload))
        assert seen == [1, 2, 3] and payload == b""
        assert mirror.hashes == cached_hashes(sched) and len(mirror.hashes) == 3 * 3  # 12 tokens: 3 blocks each
        replay.close(linger=0)
    finally:
        publisher.close()
        ctx.destroy(linger=0)


def test_the_first_batch_clears_and_names_the_data_parallel_rank(tmp_path):
    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/events"
    replay_endpoint = f"ipc://{tmp_path}/replay"
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint=endpoint, replay_endpoint=replay_endpoint)
    publisher = KVEventPublisher(ctx, config, data_parallel_rank=2)
    try:
        replay = ctx.socket(zmq.REQ)  # as vLLM's example subscriber asks
        replay.connect(replay_endpoint + "_dp2")  # engine 2's own sockets
        replay.send((0).to_bytes(8, "big"))
        assert replay.poll(5000)
        seq, payload = replay.recv_multipart()
        batch = DECODE.decode(payload)
        assert seq == bytes(8) and batch.data_parallel_rank == 2 and batch.events == [AllBlocksCleared()]
        replay.close(linger=0)
    finally:
        publisher.close()
        ctx.destroy(linger=0)


def test_the_config_is_vllms_json_and_refuses_to_publish_prompts_on_every_interface():
    assert parse_kv_events_config(None) is None
    assert parse_kv_events_config('{"enable_kv_cache_events": false}') is None
    assert parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "null"}') is None
    config = parse_kv_events_config('{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:6000", '
                                    '"replay_endpoint": "tcp://127.0.0.1:6100", "topic": "kv", "buffer_steps": 5, '
                                    '"max_queue_size": 100}')  # vLLM's, for its publisher thread: ignored
    assert (config.publisher, config.topic, config.buffer_steps) == ("zmq", "kv", 5)
    assert config.for_rank(3).endpoint == "tcp://127.0.0.1:6003" and config.for_rank(3).replay_endpoint.endswith(":6103")
    # loopback and ipc are bound (subscribers here connect), another host is connected to (its subscriber binds)
    assert [binds(e) for e in ("tcp://127.0.0.1:1", "tcp://[::1]:1", "tcp://localhost:1", "ipc:///x", "tcp://indexer:1")] \
        == [True, True, True, True, False]
    assert parse_kv_events_config('{"enable_kv_cache_events": true, "endpoint": "tcp://indexer:5557"}')
    for text, message in [('{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}', "every interface"),
                          ('{"enable_kv_cache_events": true, "endpoint": "tcp://[::]:5557"}', "every interface"),
                          ('{"enable_kv_cache_events": true, "replay_endpoint": "tcp://0.0.0.0:5558"}', "loopback"),
                          ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "unknown publisher"),
                          ('{"enable_kv_cache_events": true, "colour": 1}', "unknown field"),
                          ('{"enable_kv_cache_events": "yes"}', "must be a bool"),
                          ('{"enable_kv_cache_events": true, "endpoint": "http://x"}', "tcp:// or ipc://"),
                          ('{"enable_kv_cache_events": true, "endpoint": "inproc://x"}', "tcp:// or ipc://"),
                          ("[1]", "JSON object"), ("{", "not JSON")]:
        with pytest.raises(ValueError, match=message):
            parse_kv_events_config(text)
    events = '{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558"}'
    EngineConfig.of(kv_events_config=events).validate()
    with pytest.raises(ValueError, match="at least D apart"):  # engine 1's PUB would take engine 0's replay port
        EngineConfig.of(kv_events_config=events, data_parallel_size=2).validate()
    with pytest.raises(ValueError, match="needs prefix caching"):
        EngineConfig.of(kv_events_config=events, enable_prefix_caching=False).validate()


def test_a_loopback_ipv6_endpoint_binds_and_delivers(tmp_path):
    ctx = zmq.Context()
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://[::1]:0", replay_endpoint=None)
    try:
        publisher = KVEventPublisher(ctx, config, 0)
        endpoint = publisher.pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        assert endpoint.startswith("tcp://[::1]:")
        sub = subscribe(ctx, endpoint)
        assert DECODE.decode(first_batch(sub, publisher)[2]).data_parallel_rank == 0
        sub.close(linger=0)
        publisher.close()
    finally:
        ctx.destroy(linger=0)
