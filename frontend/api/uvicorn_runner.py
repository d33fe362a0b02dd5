"""uvicorn under our own signal handling, shared by `tinyvllm serve` and `tinyvllm router`: the first SIGTERM or
SIGINT starts a graceful drain (frontend/api/request_gate.py), a second one cuts its wait short."""
import asyncio
import contextlib
import logging
import signal

import uvicorn

from tinyvllm.frontend.api.request_gate import MAX_HEADER_BYTES, RequestGate


def http_config(app, host: str, port: int, uds: str | None = None) -> uvicorn.Config:
    """uds: a unix socket to listen on instead of host:port."""
    # h11, uvicorn's pure-Python parser, drops a connection whose head is still unparsed past its bound; set well
    # above the request gate's MAX_HEADER_BYTES, so a head that size gets the gate's clear 431 instead
    return uvicorn.Config(app, host=host, port=port, uds=uds, loop="none", log_level="warning",
                          timeout_graceful_shutdown=5, lifespan="off", http="h11",
                          h11_max_incomplete_event_size=4 * MAX_HEADER_BYTES)


class QuietSignalServer(uvicorn.Server):
    """uvicorn without its own signal handlers: drain_on_signals handles SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def start_serving(server: uvicorn.Server) -> asyncio.Task:
    """Starts server.serve() and returns its task once the socket listens (or once serving ended, e.g. a port in
    use: check server.started)."""
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    return serving


def drain_on_signals(stop_asked: asyncio.Event, gate: RequestGate, server: uvicorn.Server) -> None:
    """The first SIGTERM or SIGINT sets stop_asked (the caller drains); another one ends the drain's wait and
    uvicorn's at once."""
    def on_signal() -> None:
        if stop_asked.is_set():
            gate.hurry()
            server.force_exit = True
        stop_asked.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)


async def serve_until_drained(server: uvicorn.Server, serving: asyncio.Task, gate: RequestGate,
                              shutdown_timeout_s: float, fail_open, log: logging.Logger) -> None:
    """Serves until SIGTERM or SIGINT, then drains (new requests get 503; open ones get shutdown_timeout_s, then
    fail_open(reason) ends the rest) and stops the HTTP server; or returns once serving ended by itself."""
    stop_asked = asyncio.Event()
    drain_on_signals(stop_asked, gate, server)
    stopping = asyncio.create_task(stop_asked.wait())
    await asyncio.wait((serving, stopping), return_when=asyncio.FIRST_COMPLETED)
    if stopping.done():
        log.info("draining: %d requests open; new ones get 503 (up to %g s)", gate.open, shutdown_timeout_s)
        if left := await gate.drain(shutdown_timeout_s, fail_open):
            log.warning("%d requests did not finish within --shutdown-timeout and ended with an error", left)
    stopping.cancel()
    server.should_exit = True
    await serving
