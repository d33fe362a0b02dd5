"""An engine's own KV events (--kv-events-config; scheduler/kv_events.py) followed by its server: a SUB socket on the
engine's endpoint, each batch's events handed on. They keep the replica router's view of that engine's prefix cache
current (so a prompt whose blocks the engine evicted no longer draws requests to it, and one it loaded from disk
does) and what GET /kv_events tells routers elsewhere (frontend/engine/held_blocks.py). Only where the engine binds
its endpoint (loopback or ipc://); an engine that connects out to a remote indexer has nothing here to subscribe
to."""
import asyncio
import logging
from collections.abc import Callable

import msgpack
import zmq
import zmq.asyncio

from tinyvllm.protocol.kv_events_config import KVEventsConfig, binds, ipv6

log = logging.getLogger("tinyvllm.frontend")
MAX_BATCH_BYTES = 64 << 20  # a step's events: a few KB per block stored; far under this


def can_follow(config: KVEventsConfig | None) -> bool:
    return config is not None and binds(config.endpoint)


async def follow_kv_events(ctx: zmq.asyncio.Context, config: KVEventsConfig, data_parallel_rank: int,
                           apply: Callable[[list], None]) -> None:
    """Hands engine `data_parallel_rank`'s events, a batch's list at a time, to `apply` until cancelled (across the
    engine's restarts: ZMQ reconnects to the address the new engine binds)."""
    endpoint = config.for_rank(data_parallel_rank).endpoint
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES)
    sub.setsockopt(zmq.IPV6, ipv6(endpoint))
    sub.setsockopt(zmq.SUBSCRIBE, config.topic.encode())
    sub.connect(endpoint)
    try:
        while True:
            frames = await sub.recv_multipart()
            try:
                batch = msgpack.unpackb(frames[-1], strict_map_key=False) if len(frames) == 3 else None
                events = batch.get("events") if isinstance(batch, dict) else None
            except Exception:  # msgpack raises several kinds (an unhashable map key is a TypeError)
                events = None
            if not isinstance(events, list):
                log.warning("ignored a malformed KV event batch from %s", endpoint)
                continue
            apply(events)
    except asyncio.CancelledError:
        raise
    except Exception:  # never: a routing view that silently stops following would go stale
        log.exception("following the KV events of %s failed; the router routes on what it routed", endpoint)
    finally:
        sub.close(linger=0)
