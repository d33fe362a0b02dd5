"""Forwarding one client request to an instance, and its answer back as it comes.

1. The body is read, bounded as `tinyvllm serve` bounds it, and its prompt hashed (prompt_chunks.py; with
   --tokenizer, prompt_tokens.py).
2. The picker chooses among the routable instances; the request goes out with the client's headers (the router's
   --instance-api-key, when given, replaces the client's Authorization).
3. Until the answer's first byte reaches the client, a failure moves the request to another instance, at most
   MAX_RETRIES times: a refused connection (that instance is unavailable until it answers again), a connection that
   broke before the answer, or a 503 (draining, busy, no engine). The status and headers go out with the first body
   bytes, so a stream that breaks before its first event is retried too.
4. Afterwards a failure ends the stream with an explicit error event (stream_framing.py). A whole-body answer is
   read completely before any of it is sent, so it is never cut.
5. A client that disconnects cancels the exchange: closing the upstream response closes its connection, and the
   instance aborts the request. When the router's drain runs out of time, open exchanges end with an error.
"""
import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from tinyvllm.frontend.api.http_json import DEFAULT_MAX_BODY_BYTES, read_bounded_body
from tinyvllm.frontend.api.request_gate import current_ticket, send_error
from tinyvllm.frontend.router import disaggregation as pd
from tinyvllm.frontend.router import router_metrics as m
from tinyvllm.frontend.router.instance_clients import InstanceClients
from tinyvllm.frontend.router.instance_picker import InstancePicker
from tinyvllm.frontend.router.instance_registry import Instance, InstanceRegistry
from tinyvllm.frontend.router.prompt_chunks import request_chunk_hashes
from tinyvllm.frontend.router.stream_framing import StreamFraming, stream_kind

log = logging.getLogger("tinyvllm.router")

MAX_RETRIES = 2
RETRY_AFTER_S = 1
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade"})
_NOT_SENT_UPSTREAM = _HOP_BY_HOP | {"host", "content-length"}
_NOT_SENT_BACK = _HOP_BY_HOP | {"content-length", "date", "server"}  # uvicorn writes its own


class Shutdown:
    """Set when the router's drain ran out of time: the exchanges still open end with `reason`."""

    def __init__(self):
        self.event, self.reason = asyncio.Event(), ""

    def fail_open(self, reason: str) -> None:
        self.reason = reason
        self.event.set()


class _NotAnswered(Exception):
    """The instance gave no answer the client has seen any of; `reply` is its 503 (status, headers, body), if any."""

    def __init__(self, reply: tuple[int, list, bytes] | None = None):
        self.reply = reply


@dataclass(slots=True)
class _Exchange:
    path: str
    started: bool = False  # the response's start went to the client
    framing: StreamFraming | None = None


PromptHashes = Callable[[str, bytes], Awaitable[list[bytes]]]


async def chunk_hashes_of(path: str, body: bytes) -> list[bytes]:
    return request_chunk_hashes(body)


class UpstreamProxy:
    """The ASGI app behind every /v1 and /api path of the router."""

    def __init__(self, registry: InstanceRegistry, picker: InstancePicker, clients: InstanceClients,
                 metrics: m.RouterMetrics, shutdown: Shutdown, instance_api_key: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, prompt_hashes: PromptHashes = chunk_hashes_of):
        """prompt_hashes(path, body): the prompt's prefix-cache keys (text chunks, or the instances' block hashes)."""
        self.registry, self.picker, self.clients, self.metrics = registry, picker, clients, metrics
        self.prompt_hashes = prompt_hashes
        self.shutdown, self.max_body_bytes = shutdown, max_body_bytes
        self.instance_authorization = f"Bearer {instance_api_key}".encode() if instance_api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, too_large = scope["path"], OverflowError()
        try:
            body = await read_bounded_body(Request(scope, receive), self.max_body_bytes, too_large)
        except OverflowError:
            await send_error(send, path, 413, f"The request body is larger than {self.max_body_bytes} bytes",
                             "RequestEntityTooLargeError")
            return
        except ClientDisconnect:
            return
        await self.forward(scope, body, receive, send)

    async def forward(self, scope: Scope, body: bytes, receive: Receive, send: Send,
                      candidates: list[Instance] | None = None) -> None:
        """Answers the request, whose body was read, from one of `candidates` (default: every routable instance)."""
        path = scope["path"]
        exchange = _Exchange(path)
        work = asyncio.ensure_future(self._forward(exchange, scope, body, send, candidates))
        client_left = asyncio.ensure_future(_disconnected(receive))
        stopped = asyncio.ensure_future(self.shutdown.event.wait())
        try:
            await asyncio.wait((work, client_left, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            client_left.cancel()
            stopped.cancel()
            work.cancel()  # closes the upstream response: the instance sees the disconnect and aborts
            await asyncio.gather(work, return_exceptions=True)
        if not work.cancelled() and work.exception() is None:
            return
        if client_left.done() and not client_left.cancelled():
            return
        if work.cancelled():
            await self._end(exchange, send, self.shutdown.reason, 503, "ServiceUnavailableError")
        else:
            log.error("unexpected error proxying %s", path, exc_info=work.exception())
            await self._end(exchange, send, "Internal router error", 500, "InternalServerError")

    async def _forward(self, exchange: _Exchange, scope: Scope, body: bytes, send: Send,
                       candidates: list[Instance] | None) -> None:
        hashes = await self.prompt_hashes(scope["path"], body) if scope["method"] == "POST" and \
            self.picker.uses_prefixes else []
        headers = [(k, v) for k, v in scope["headers"] if k.decode("latin-1").lower() not in _NOT_SENT_UPSTREAM]
        if self.instance_authorization is not None:
            headers = [(k, v) for k, v in headers if k.lower() != b"authorization"]
            headers.append((b"authorization", self.instance_authorization))
        target = scope["path"] + (f"?{scope['query_string'].decode('latin-1')}" if scope["query_string"] else "")
        tried, refused, role = set(), None, None
        if pd.disaggregates(scope["method"], scope["path"], self.registry.routable()) and \
                (request := pd.parse_body(body)) is not None:
            try:
                kv = await pd.run_prefill(self, target, headers, request, hashes)
            except pd.PrefillReply as e:
                await send({"type": "http.response.start", "status": e.status, "headers": [
                    *e.headers, (b"content-length", str(len(e.body)).encode())]})
                await send({"type": "http.response.body", "body": e.body})
                return
            body, role = pd.decode_body(request, kv), pd.DECODE
        for _ in range(1 + MAX_RETRIES):
            routable = self.registry.routable() if candidates is None else candidates
            choice = self.picker.pick([i for i in routable if i.url not in tried and role in (None, i.role)], hashes)
            if choice is None:
                break
            instance, reason = choice
            tried.add(instance.url)
            self.metrics.decisions.labels(instance.url, reason).inc()
            self.registry.opened(instance)
            self.picker.opened(instance, hashes)
            try:
                with self.clients.using(instance.url) as client:
                    request = client.build_request(scope["method"], instance.url + target, headers=headers,
                                                   content=body)
                    await self._attempt(exchange, instance, client, request, send)
                return
            except _NotAnswered as e:
                if e.reply is not None:
                    refused = (instance, e.reply)
            finally:
                self.registry.closed(instance)
                self.picker.closed(instance)
        if refused is not None:  # every try answered 503 or failed: the last 503 as it came
            instance, (status, reply_headers, reply_body) = refused
            self.metrics.requests.labels(instance.url, str(status)).inc()
            await send({"type": "http.response.start", "status": status, "headers": [
                *reply_headers, (b"content-length", str(len(reply_body)).encode())]})
            await send({"type": "http.response.body", "body": reply_body})
            return
        self.metrics.errors.labels(m.NO_INSTANCE, m.NO_ROUTABLE).inc()
        self.metrics.requests.labels(m.NO_INSTANCE, "503").inc()
        await send_error(send, exchange.path, 503, "No instance is available to serve this request; retry later.",
                         headers=[(b"retry-after", str(RETRY_AFTER_S).encode())])

    async def _attempt(self, exchange: _Exchange, instance: Instance, client: httpx.AsyncClient,
                       request: httpx.Request, send: Send) -> None:
        """Answers the client from `instance`, or raises _NotAnswered while the client has seen nothing."""
        try:
            upstream = await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            self.registry.unreachable(instance)
            self._failed(instance, m.CONNECT_FAILED, e)
            raise _NotAnswered() from None
        except httpx.TransportError as e:
            self._failed(instance, m.DROPPED, e)
            raise _NotAnswered() from None
        try:
            kind = stream_kind(upstream.headers.get("content-type", ""))
            if upstream.status_code == 503:
                body = await _read_whole(upstream)
                self._failed(instance, m.UNAVAILABLE, None)
                raise _NotAnswered((503, _headers_back(upstream), body))
            if kind is None:
                body = await _read_whole(upstream)
                await self._start(exchange, instance, upstream, send, [(b"content-length", str(len(body)).encode())])
                await send({"type": "http.response.body", "body": body})
            else:
                await self._stream(exchange, instance, upstream, StreamFraming(kind), send)
        except httpx.TransportError as e:
            if exchange.started:
                raise
            self._failed(instance, m.DROPPED, e)
            raise _NotAnswered() from None
        finally:
            await upstream.aclose()

    async def _stream(self, exchange: _Exchange, instance: Instance, upstream: httpx.Response, framing: StreamFraming,
                      send: Send) -> None:
        exchange.framing = framing
        try:
            async for chunk in upstream.aiter_raw():
                if frames := framing.feed(chunk):
                    await self._start(exchange, instance, upstream, send)
                    await send({"type": "http.response.body", "body": frames, "more_body": True})
            await self._start(exchange, instance, upstream, send)
            await send({"type": "http.response.body", "body": framing.rest()})
        except httpx.TransportError as e:
            if not exchange.started:
                raise
            if framing.ended:
                await send({"type": "http.response.body", "body": b""})
                return
            self._failed(instance, m.BROKEN_STREAM, e)
            await send({"type": "http.response.body", "body": framing.error_event(
                f"The instance serving this request failed mid-answer ({type(e).__name__}); the answer is "
                f"incomplete.")})

    async def _start(self, exchange: _Exchange, instance: Instance, upstream: httpx.Response, send: Send,
                     extra_headers: list = ()) -> None:
        if exchange.started:
            return
        await send({"type": "http.response.start", "status": upstream.status_code,
                    "headers": [*_headers_back(upstream), *extra_headers]})
        exchange.started = True
        self.metrics.requests.labels(instance.url, str(upstream.status_code)).inc()
        if (ticket := current_ticket()) is not None:
            ticket.stop_waiting()  # --max-waiting-requests counts requests without any answer yet

    async def _end(self, exchange: _Exchange, send: Send, message: str, status: int, type_: str) -> None:
        """Ends an exchange the router had to stop, in whatever shape the client is still owed."""
        if not exchange.started:
            await send_error(send, exchange.path, status, message, type_)
        elif exchange.framing is not None and not exchange.framing.ended:
            await send({"type": "http.response.body", "body": exchange.framing.error_event(message, status, type_)})
        else:
            await send({"type": "http.response.body", "body": b""})

    def _failed(self, instance: Instance, reason: str, error: Exception | None) -> None:
        self.metrics.errors.labels(instance.url, reason).inc()
        log.warning("instance %s: %s%s", instance.url, reason, f" ({error!r})" if error is not None else "")


async def _read_whole(upstream: httpx.Response) -> bytes:
    return b"".join([chunk async for chunk in upstream.aiter_raw()])  # raw: any content-encoding passes as it is


def _headers_back(upstream: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in upstream.headers.raw if k.decode("latin-1").lower() not in _NOT_SENT_BACK]


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
