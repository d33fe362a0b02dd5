"""In-process pieces for the proxy tests, all on real sockets in the test's event loop: scripted upstream servers
(RawUpstream, a few lines of HTTP/1.1 each, so a test can cut a connection where it likes) and a router serving on
a free port (running_router)."""
import asyncio
import contextlib
from dataclasses import dataclass, field

import httpx
import uvicorn

from tinyvllm.frontend.api.request_gate import RequestGate
from tinyvllm.frontend.router.app import build_router_app
from tinyvllm.frontend.router.instance_clients import InstanceClients
from tinyvllm.frontend.router.instance_picker import InstancePicker
from tinyvllm.frontend.router.instance_registry import STATIC, InstanceRegistry, Load
from tinyvllm.frontend.router.router_metrics import RouterMetrics
from tinyvllm.frontend.router.upstream_proxy import Shutdown, UpstreamProxy
from tinyvllm.frontend.api.uvicorn_runner import QuietSignalServer, start_serving

WAIT_S = 20  # generous: the machine may be loaded


async def until(condition) -> None:
    """Waits until condition() holds, at most WAIT_S."""
    for _ in range(int(WAIT_S / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


@dataclass
class Exchange:
    """One request an upstream received, and the means to answer it."""
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    peer_closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self, status: int = 200, content_type: str = "text/event-stream") -> None:
        self.writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n"
                          f"connection: close\r\n\r\n".encode())
        await self.writer.drain()

    async def chunk(self, data: bytes) -> None:
        self.writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await self.writer.drain()

    async def end(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    async def whole(self, status: int, body: bytes, content_type: str = "application/json",
                    headers: tuple[str, ...] = ()) -> None:
        extra = "".join(f"{h}\r\n" for h in headers)
        self.writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
                          f"{extra}connection: close\r\n\r\n".encode() + body)
        await self.writer.drain()

    def abort(self) -> None:
        """Cuts the connection as a killed process would (a reset, no end of the chunked body)."""
        self.writer.transport.abort()


class RawUpstream:
    """A tiny HTTP/1.1 server; `answer(exchange)` scripts the reply to every request (one per connection)."""

    def __init__(self, answer):
        self.answer, self.exchanges = answer, []
        self.url = ""

    async def __aenter__(self) -> "RawUpstream":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            method, path, _ = head[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in head[1:] if line)}
            body = await reader.readexactly(int(headers.get("content-length", 0)))
            exchange = Exchange(method, path, headers, body, reader, writer)
            self.exchanges.append(exchange)
            watcher = asyncio.ensure_future(_watch_close(exchange))
            try:
                await self.answer(exchange)
            finally:
                watcher.cancel()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _watch_close(exchange: Exchange) -> None:
    with contextlib.suppress(ConnectionError):
        while await exchange.reader.read(1024):
            pass
    exchange.peer_closed.set()


def refused_url() -> str:
    """A URL nothing listens on."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@dataclass
class RunningRouter:
    url: str
    registry: InstanceRegistry
    metrics: RouterMetrics
    shutdown: Shutdown
    gate: RequestGate


@contextlib.asynccontextmanager
async def running_router(instances: dict[str, int] | None = None, api_key: str | None = None,
                         register_secret: str | None = None, instance_api_key: str | None = None,
                         max_body_bytes: int = 8 * 1024 * 1024):
    """A router serving on a free port; `instances`: static instance URL -> its running requests (all healthy)."""
    registry = InstanceRegistry()
    for url, running in (instances or {}).items():
        registry.add(url, STATIC)
        registry.health_checked(url, True, Load(running=running))
    gate, shutdown = RequestGate(), Shutdown()
    async with InstanceClients(timeout=httpx.Timeout(5.0, read=None), trust_env=False) as clients:
        metrics = RouterMetrics(registry)
        proxy = UpstreamProxy(registry, InstancePicker(), clients, metrics, shutdown, instance_api_key, max_body_bytes)
        app = build_router_app(registry, proxy, metrics, gate, api_key, register_secret)
        server = QuietSignalServer(uvicorn.Config(app, host="127.0.0.1", port=0, loop="none", log_level="warning",
                                                  lifespan="off", timeout_graceful_shutdown=1))
        serving = await start_serving(server)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield RunningRouter(f"http://127.0.0.1:{port}", registry, metrics, shutdown, gate)
        finally:
            server.should_exit = True
            await serving


def metric(router: RunningRouter, name: str, **labels: str) -> float:
    value = router.metrics.registry.get_sample_value("tinyvllm_router:" + name, labels)
    return value or 0.0
