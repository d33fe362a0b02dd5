"""Which generation requests the server takes on, and for how long: the waiting limit, the request deadline and the
drain on shutdown.

A generation request (a POST to one of GENERATION_PATHS) *waits* from its arrival until the engine's first output
for it: reading and tokenizing it, then its time in the scheduler's queue. With `max_waiting` requests waiting, a
new one gets 503 with Retry-After before its body is even read (as Ollama answers past OLLAMA_MAX_QUEUE, 512).
The middleware gives each admitted request a Ticket through a context variable (tasks the handler starts inherit
it); ServedEngine (frontend/api/served_engine.py), the engine every route speaks to, reads it to mark the first
output and to end the request at its deadline (--request-timeout) with an explicit error. drain() is the graceful
shutdown: from then on every new request gets 503 + Connection: close (/health too, so load balancers move away),
open ones may finish until the shutdown timeout, and the rest then end with an error. An admitted request's body is
read at once, within BODY_TIMEOUT_S (or its deadline): a client that stalls while sending it gets a 408 and its slot
back.

A pure ASGI middleware, as frontend/api/auth.py explains.
"""
import asyncio
import contextvars
import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tinyvllm.frontend.api.auth import error_body_for

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses",
                              "/v1/embeddings", "/rerank", "/v1/rerank", "/v2/rerank", "/score", "/v1/score",
                              "/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/api/rerank"})
OPEN_WHILE_DRAINING = frozenset({"/metrics"})
MAX_HEADER_BYTES = 16 * 1024  # h11's bound on an unparsed head, which a head arriving in one read escapes
RETRY_AFTER_S = 1
ABORT_GRACE_S = 2.0  # after the drain's requests were failed, how long their handlers get to answer
BODY_TIMEOUT_S = 30.0  # how long after its headers an admitted request's body may take to arrive
QUEUE_FULL, SHUTTING_DOWN = "queue_full", "shutting_down"


class Ticket:
    __slots__ = ("gate", "deadline", "waiting")

    def __init__(self, gate: "RequestGate", deadline: float | None):
        self.gate, self.deadline, self.waiting = gate, deadline, True  # deadline: in the event loop's time
        gate.waiting += 1

    def stop_waiting(self) -> None:
        if self.waiting:
            self.waiting = False
            self.gate.waiting -= 1


_ticket: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("tinyvllm_request_ticket", default=None)


def current_ticket() -> Ticket | None:
    """The admitted generation request's ticket (None outside one): whoever sees its first output ends its wait."""
    return _ticket.get()


class RequestGate:
    def __init__(self, max_waiting: int = 512, request_timeout_s: float | None = None):
        self.max_waiting, self.request_timeout_s = max_waiting, request_timeout_s
        self.waiting = 0  # admitted generation requests without an engine output yet
        self.open = 0  # admitted generation requests not answered yet
        self.rejected = {QUEUE_FULL: 0, SHUTTING_DOWN: 0}
        self.draining = False
        self.shutdown_reason: str | None = None  # set once the drain gave up waiting: new engine work is refused
        self._idle = asyncio.Event()
        self._idle.set()
        self._hurry = asyncio.Event()

    def admit(self, loop: asyncio.AbstractEventLoop) -> Ticket:
        self.open += 1
        self._idle.clear()
        return Ticket(self, None if self.request_timeout_s is None else loop.time() + self.request_timeout_s)

    def release(self, ticket: Ticket) -> None:
        ticket.stop_waiting()
        self.open -= 1
        if self.open == 0:
            self._idle.set()

    async def drain(self, timeout_s: float, fail_open: Callable[[str], None]) -> int:
        """Refuses new requests from now on and waits up to timeout_s for the open ones; then ends the rest with
        fail_open(reason) (every open engine request gets an error output) and gives their handlers a moment to
        answer. Returns how many requests were still open at the timeout."""
        self.draining = True
        if await self._idle_within(timeout_s, self._hurry):
            return 0
        left = self.open
        self.shutdown_reason = "The server is shutting down and could not finish this request in time"
        fail_open(self.shutdown_reason)
        await self._idle_within(ABORT_GRACE_S)
        return left

    def hurry(self) -> None:
        """Ends the drain's wait for open requests now (a second Ctrl-C)."""
        self._hurry.set()

    async def _idle_within(self, timeout_s: float, unless: asyncio.Event | None = None) -> bool:
        waits = [asyncio.ensure_future(self._idle.wait())]
        if unless is not None:
            waits.append(asyncio.ensure_future(unless.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return self._idle.is_set()


class GateMiddleware:
    def __init__(self, app: ASGIApp, gate: RequestGate, max_body_bytes: int = 8 * 1024 * 1024):
        """max_body_bytes: the app's bound (it answers 413 past it); the gate reads no more than that either."""
        self.app, self.gate, self.max_body_bytes = app, gate, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gate, path = self.gate, scope["path"]
        if sum(len(name) + len(value) for name, value in scope["headers"]) > MAX_HEADER_BYTES:
            await send_error(send, path, 431, f"The request's headers are larger than {MAX_HEADER_BYTES} bytes",
                             "RequestHeaderFieldsTooLargeError", [(b"connection", b"close")])
            return
        if gate.draining and path not in OPEN_WHILE_DRAINING:
            gate.rejected[SHUTTING_DOWN] += scope["method"] == "POST" and path in GENERATION_PATHS
            await send_error(send, path, 503, "The server is shutting down; retry on another instance.",
                             headers=[(b"connection", b"close")])
            return
        if scope["method"] != "POST" or path not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        if gate.waiting >= gate.max_waiting:
            gate.rejected[QUEUE_FULL] += 1
            await send_error(send, path, 503, f"The server is busy: {gate.waiting} requests are waiting, the most it "
                                              f"queues (--max-waiting-requests). Retry later.",
                             headers=[(b"retry-after", str(RETRY_AFTER_S).encode())])
            return
        loop = asyncio.get_running_loop()
        ticket = gate.admit(loop)
        token = _ticket.set(ticket)
        try:
            timeout_s = BODY_TIMEOUT_S if ticket.deadline is None else \
                min(BODY_TIMEOUT_S, ticket.deadline - loop.time())
            if (body := await self._body_within(scope, receive, timeout_s)) is None:
                await send_error(send, path, 408, f"The request body did not arrive within {timeout_s:g} s",
                                 "RequestTimeoutError", [(b"connection", b"close")])
                return
            await self.app(scope, _replaying(body, receive), send)
        finally:
            _ticket.reset(token)
            gate.release(ticket)

    async def _body_within(self, scope: Scope, receive: Receive, timeout_s: float) -> list[Message] | None:
        """The body's messages, read now, so that a client sending it slowly holds its waiting slot for at most
        timeout_s (None then); reading stops past max_body_bytes, and a body declared larger is left to the app, which
        answers 413 at once."""
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            return []
        messages, size = [], 0
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    messages.append(message := await receive())
                    size += len(message.get("body", b""))
                    if message["type"] != "http.request" or not message.get("more_body") or size > self.max_body_bytes:
                        return messages
        except TimeoutError:
            return None


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """receive() that first gives back the messages already read (then the client's own, e.g. its disconnect)."""
    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()
    return replay


async def send_error(send: Send, path: str, status: int, message: str, type_: str = "ServiceUnavailableError",
                     headers: list[tuple[bytes, bytes]] = ()) -> None:
    """A whole JSON error response in the route's API's shape (auth.error_body_for)."""
    body = error_body_for(path, message, status, type_)
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()), *headers]})
    await send({"type": "http.response.body", "body": raw})
