"""frontend/router/kv_event_streams.py on real sockets: the router follows an instance's GET /kv_events into its
picker, opens the stream again when it breaks or goes quiet past the keep-alive (a peer gone without a word), and
starts afresh for an instance that left and came back under its URL."""
import asyncio
import json

import pytest

from tests.router.harness import WAIT_S, RawUpstream, until
from tinyvllm.frontend.router import kv_event_streams
from tinyvllm.frontend.router.instance_clients import InstanceClients
from tinyvllm.frontend.router.instance_picker import InstancePicker
from tinyvllm.frontend.router.instance_registry import DNS, STATIC, InstanceRegistry

pytestmark = pytest.mark.anyio


def first(block_size: int, *hashes: int) -> bytes:
    return b"data: " + json.dumps({"block_size": block_size, "num_blocks": 100, "events": [
        {"type": "AllBlocksCleared"}, {"type": "BlockStored", "block_hashes": list(hashes)}]}).encode() + b"\n\n"


def change(kind: str, *hashes: int) -> bytes:
    return b"data: " + json.dumps({"events": [{"type": kind, "block_hashes": list(hashes)}]}).encode() + b"\n\n"


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(kv_event_streams, "PING_S", 0.2)  # the stream's read timeout: 0.6 s
    monkeypatch.setattr(kv_event_streams, "RETRY_S", 0.05)


async def test_a_stream_that_goes_quiet_or_breaks_is_opened_again_and_starts_from_the_whole_set(quick):
    connections = []

    async def instance(exchange):
        connections.append(exchange)
        await exchange.start()
        if len(connections) == 1:  # the whole set, a change, then silence: a peer gone without closing
            await exchange.chunk(first(16, 1, 2, 3))
            await exchange.chunk(b": ping\n\n" + change("BlockRemoved", 2))
            await asyncio.sleep(3 * WAIT_S)  # past the test's wait: only the router's read timeout ends it
        elif len(connections) == 2:  # a new whole set, then a cut
            await exchange.chunk(first(16, 7, 8))
            await exchange.chunk(change("BlockStored", 9))
            exchange.abort()
        else:
            await exchange.chunk(first(16, 5))
            await asyncio.sleep(WAIT_S)

    registry, picker = InstanceRegistry(), InstancePicker()
    async with RawUpstream(instance) as up, InstanceClients(trust_env=False) as clients:
        registry.add(up.url, STATIC)
        streams = kv_event_streams.KVEventStreams(registry, clients, picker, instance_api_key="k" * 16)
        following = asyncio.create_task(streams.run())
        try:
            def held():
                return set(picker.router.prefixes[picker._slots[up.url]]._hashes) if up.url in picker._slots else set()
            await until(lambda: held() == {1, 3})
            assert streams.block_size == 16 and up.url in streams.following
            assert connections[0].headers["authorization"] == "Bearer " + "k" * 16
            await until(lambda: len(connections) >= 2 and held() in ({7, 8, 9}, {5}))
            await until(lambda: len(connections) == 3 and held() == {5})
            assert picker.router.prefixes[picker._slots[up.url]].capacity == 100
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)


async def test_an_instance_that_left_is_unfollowed_and_one_back_under_its_url_followed_afresh(quick):
    served = []

    async def instance(exchange):
        served.append(exchange)
        await exchange.start()
        await exchange.chunk(first(16, len(served)))
        await asyncio.sleep(WAIT_S)

    registry, picker = InstanceRegistry(), InstancePicker()
    async with RawUpstream(instance) as up, InstanceClients(trust_env=False) as clients:
        registry.add(up.url, DNS)
        streams = kv_event_streams.KVEventStreams(registry, clients, picker)
        following = asyncio.create_task(streams.run())
        try:
            await until(lambda: up.url in streams.following and picker.known_blocks(up.url) == 1)
            registry.sync_dns(set())  # gone from DNS: drained, and with nothing open, removed
            await until(lambda: up.url not in streams.following and not streams._streams)
            registry.add(up.url, DNS)  # back, a new Instance: a new stream, its own whole set
            await until(lambda: len(served) == 2 and up.url in streams.following)
            assert "authorization" not in served[1].headers
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
