"""--kv-events-config on a served engine pair (--data-parallel-size 2): each engine publishes on its own sockets
(ports + rank, ipc addresses + "_dp<rank>"), opens with AllBlocksCleared labelled with its rank, and stores a
prompt's full blocks under the hashes the replica router keys its cache-aware choice by (prompt_block_hashes), in
vLLM's integer form; a subscriber that joins late gets it all from the replay socket."""
import json

import msgspec
import zmq

from tests.e2e.http_helpers import complete, completion_body
from tests.e2e.server_process import wait_until
from tinyvllm.frontend.engine.replica_router import prompt_block_hashes
from tinyvllm.protocol.kv_events import external_hash
from tinyvllm.scheduler.kv_events import END_OF_REPLAY

BLOCK_SIZE = 16


def replayed(ctx: zmq.Context, endpoint: str) -> list[dict]:
    """Every batch the engine at `endpoint` keeps, from the first, decoded as plain msgpack."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart((b"", bytes(8)))
    batches = []
    try:
        while True:
            assert dealer.poll(10_000), f"no answer from {endpoint}"
            _, seq, payload = dealer.recv_multipart()
            if seq == END_OF_REPLAY:
                return batches
            assert int.from_bytes(seq, "big") == len(batches)
            batches.append(msgspec.msgpack.decode(payload))
    finally:
        dealer.close(linger=0)


def stored(batches: list[dict]) -> set[int]:
    return {h for batch in batches for event in batch["events"] if event["type"] == "BlockStored"
            for h in event["block_hashes"]}


def test_each_engine_publishes_its_blocks_under_the_routers_hashes(server_factory, tmp_path):
    events, replay = f"ipc://{tmp_path}/kv-events", f"ipc://{tmp_path}/kv-replay"
    server = server_factory("--data-parallel-size", "2", "--kv-events-config", json.dumps(
        {"enable_kv_cache_events": True, "endpoint": events, "replay_endpoint": replay, "topic": "kv"}))
    prompt = [(7 * i) % 200 + 3 for i in range(3 * BLOCK_SIZE + 5)]  # three full blocks and a part
    complete(server.url, "/v1/completions", completion_body(prompt, max_tokens=2))
    expected = {external_hash(h) for h in prompt_block_hashes(prompt, BLOCK_SIZE)}
    ctx = zmq.Context()
    try:
        endpoints = {0: replay, 1: replay + "_dp1"}
        assert wait_until(lambda: expected <= stored(replayed(ctx, endpoints[0])) | stored(replayed(ctx, endpoints[1])),
                          30)
        for rank, endpoint in endpoints.items():
            batches = replayed(ctx, endpoint)
            assert batches[0]["events"] == [{"type": "AllBlocksCleared"}] and batches[0]["data_parallel_rank"] == rank
            assert all(batch["data_parallel_rank"] == rank for batch in batches)
        # the prompt went to one engine: its first block has no parent, the next ones chain
        (chain,) = [event for endpoint in endpoints.values() for batch in replayed(ctx, endpoint)
                    for event in batch["events"] if event["type"] == "BlockStored"
                    and event["block_hashes"][0] == external_hash(prompt_block_hashes(prompt, BLOCK_SIZE)[0])]
        assert chain["parent_block_hash"] is None and chain["token_ids"][:3 * BLOCK_SIZE] == prompt[:3 * BLOCK_SIZE]
        assert chain["block_size"] == BLOCK_SIZE and chain["medium"] == "GPU"
    finally:
        ctx.destroy(linger=0)
