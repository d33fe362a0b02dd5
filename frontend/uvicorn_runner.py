"""uvicorn under our own signal handling, shared by `tinyvllm serve` and `tinyvllm router`: the first SIGTERM or
SIGINT starts a graceful drain (frontend/request_gate.py), a second one cuts its wait short."""
import asyncio
import contextlib
import signal

import uvicorn

from tinyvllm.frontend.request_gate import RequestGate


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


def drain_on_signals(stop_asked: asyncio.Event, gate: RequestGate) -> None:
    """The first SIGTERM or SIGINT sets stop_asked (the caller drains); another one ends the drain's wait at once."""
    def on_signal() -> None:
        if stop_asked.is_set():
            gate.hurry()
        stop_asked.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
