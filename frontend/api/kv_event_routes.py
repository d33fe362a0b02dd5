"""GET /kv_events: the blocks this server's engines hold, as server-sent events, for `tinyvllm router` replicas
(frontend/router/kv_event_streams.py) that route by cached prefixes without having routed the requests themselves.

The first event is the whole set, `{"block_size", "num_blocks", "events": [AllBlocksCleared, BlockStored]}`, each
later one the changes, `{"events": [BlockRemoved?, BlockStored?]}`: vLLM's event names and integer block hashes
(protocol/kv_events.py), without token ids (frontend/engine/held_blocks.py). It needs the engines' own KV events
(--kv-events-config with a loopback or ipc:// endpoint: 404 otherwise), the API key where one is set (like /v1), and
it ends when the server drains. A quiet stream sends a comment line every PING_S, so a router notices a connection
that died without a word (and the server a router that did). At most MAX_STREAMS at once (503 past them): one per
router replica.
"""
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinyvllm.frontend.api.openai_protocol import error_body
from tinyvllm.frontend.api.streaming import StreamSlots, sse_event

PATH = "/kv_events"
MAX_STREAMS = 64
QUIET_CHECK_S = 1.0  # how often a quiet stream looks at the drain
PING_S = 5.0  # a quiet stream's keep-alive: a router takes 3 x this without a byte as a dead connection
PING = b": ping\n\n"


def kv_event_routes(engine, gate) -> list[Route]:
    held = getattr(engine, "held_blocks", None)
    slots = StreamSlots(MAX_STREAMS, f"At most {MAX_STREAMS} routers may follow the KV events at once")

    async def changes(subscription):
        quiet_since = time.monotonic()
        while not gate.draining:  # a stream would otherwise hold the server's graceful shutdown open
            try:
                batch = await subscription.next(QUIET_CHECK_S)
            except TimeoutError:
                if time.monotonic() - quiet_since >= PING_S:  # a comment line: a router whose peer vanished notices
                    quiet_since = time.monotonic()
                    yield PING
                continue
            if batch is None:
                return
            quiet_since = time.monotonic()
            yield sse_event(batch)

    async def kv_events(request: Request) -> Response:
        if held is None:
            return JSONResponse(error_body("This server follows no KV events: start it with --kv-events-config and "
                                           "a loopback or ipc:// endpoint", "NotFoundError", 404), status_code=404)
        def subscribed():
            subscription = held.subscribe()
            return changes(subscription), lambda: held.unsubscribe(subscription)
        return slots.stream(subscribed)

    return [Route(PATH, kv_events, methods=["GET"], include_in_schema=False)]  # an endless stream
