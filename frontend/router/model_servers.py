"""`tinyvllm serve --models-dir` (no --model): each stored model runs in a server of its own, started on demand.

A model's server is a whole `tinyvllm serve` (frontend, scheduler, workers; `python -m tinyvllm.frontend.api.server`)
with the parent's engine flags and that model's weights, listening on a unix socket in a private (0700) folder: one
process tree per model, as llama.cpp's router mode and Ollama's runners, so that a model that fails or is unloaded
takes nothing else with it and gives all its memory back. The first request that names a model starts its server;
it and the requests that follow wait until it is ready (or fail with the reason it did not start). When its last
request ends, the model stays loaded for that request's keep_alive (Ollama's meaning: 0 unloads it at once, a
negative value never) and is then stopped. Starting a model past --max-loaded-models, or (with 0, the default) past
the memory the machine has free, first stops the least recently used idle model; a model with requests in flight is
never stopped, so a start that needs room waits until one is idle (bounded by the request's deadline).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import pathlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from tinyvllm.frontend.api.ollama import model_info, names
from tinyvllm.frontend.api.ollama.keep_alive import FOREVER
from tinyvllm.frontend.api.ollama.model_store import ModelEntry, ModelStore, StoreError
from tinyvllm.frontend.api.server_options import ServerArgs
from tinyvllm.frontend.router.instance_registry import STATIC, Instance
from tinyvllm.protocol.child_process import ChildProcess
from tinyvllm.protocol.engine_config import MAX_LORA_RANK, EngineConfig, LoRAConfig
from tinyvllm.protocol.lora_adapter import LoRAError, read_lora_adapter
from tinyvllm.protocol.model_config import read_model_config

log = logging.getLogger("tinyvllm.models")

LOADING, LOADED = "loading", "loaded"
HEALTH_POLL_S = 0.2
PROCESS_OVERHEAD_BYTES = 512 << 20  # a model's Python processes beyond its weights and KV cache


class ModelLoadError(Exception):
    """A model's server did not start; every request waiting for it gets this (a 500 naming the reason)."""


@dataclass(eq=False)
class ModelServer:
    """One model's server: its process, where it listens, and what keeps it loaded."""
    name: str  # the name it serves under: the stored name, without ":latest"
    entry: ModelEntry
    process: ChildProcess
    folder: pathlib.Path  # private; holds its http.sock
    client: httpx.AsyncClient
    instance: Instance  # for the proxy (frontend/router/upstream_proxy.py)
    state: str = LOADING
    ready: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    open: int = 0  # requests in flight
    keep_alive_s: float = 0.0  # the last request to start sets it (Ollama's rule); /models/unload sets 0
    idle_since: float = 0.0  # the clock's time its last request ended
    expiry: asyncio.TimerHandle | None = None

    @property
    def expires_at(self) -> float | None:
        """The clock's time it will be stopped; None while busy or kept forever."""
        if self.open or self.state != LOADED or math.isinf(self.keep_alive_s):
            return None
        return self.idle_since + self.keep_alive_s


def adapter_rank(entry: ModelEntry) -> int:
    """The largest rank of a stored model's adapter (its server's slots are that large); ModelLoadError if the adapter
    does not fit the model's weights."""
    try:
        adapter = read_lora_adapter(entry.adapter, read_model_config(pathlib.Path(entry.source)), MAX_LORA_RANK)
    except (LoRAError, OSError, ValueError) as e:
        raise ModelLoadError(f"model '{entry.name}' cannot load its adapter: {e}") from None
    return max(a.shape[0] for a, _ in adapter.values())


def memory_available() -> int:
    """The machine's free memory as the kernel estimates it (MemAvailable), in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class ModelServers:
    def __init__(self, store: ModelStore, engine: EngineConfig, child_server: ServerArgs, keep_alive_s: float,
                 max_loaded: int = 0, clock: Callable[[], float] = time.monotonic,
                 free_memory: Callable[[], int] = memory_available):
        """engine: the engine flags every model's server gets (each with its own weights); child_server: its HTTP
        options (host, port and uds are set here). max_loaded 0: as many as the free memory allows."""
        self.store, self.engine, self.child_server = store, engine, child_server
        self.keep_alive_s, self.max_loaded = keep_alive_s, max_loaded
        self.clock, self.free_memory = clock, free_memory
        self.servers: dict[str, ModelServer] = {}  # names.key -> its server, loading or loaded
        self.by_url: dict[str, ModelServer] = {}  # the proxy's instance url -> its server (ServerClients)
        self.stopping: dict[ModelServer, asyncio.Task] = {}  # until its processes are gone (their memory too)
        self._changed = asyncio.Condition()  # a request ended or a server stopped: room may have been made
        self._urls: dict[str, str] = {}  # names.key -> a url of its own, the same at every start

    def entry(self, name: str) -> ModelEntry:
        """The stored model `name`; StoreError 404 if there is none or it has no weights."""
        entry = self.store.require(name)
        if entry.source is None or not pathlib.Path(entry.source).exists():
            raise StoreError(f"model '{entry.name}' has no weights at {entry.source}", 404)
        return entry

    def served_name(self, name: str) -> str:
        return names.short_name(self.entry(name).name)

    @contextlib.asynccontextmanager
    async def use(self, name: str, keep_alive_s: float | None = None):
        """The ready server of `name` for one request; starts it if needed. keep_alive_s: how long it stays loaded
        after its requests end (None: the server's default), as of this request."""
        server = await self.acquire(name, self.keep_alive_s if keep_alive_s is None else keep_alive_s)
        try:
            yield server
        finally:
            self.release(server)

    async def acquire(self, name: str, keep_alive_s: float) -> ModelServer:
        entry = self.entry(name)
        key = names.key(entry.name)
        while True:
            server = self.servers.get(key)
            if server is not None and server.process.exitcode is not None:
                log.warning("model %s: its server exited with code %s; starting it again", server.name,
                            server.process.exitcode)
                self._stop(server)
                server = None
            if server is None:
                server = await self._start(entry)
            server.open += 1
            server.keep_alive_s = keep_alive_s
            self._cancel_expiry(server)
            try:
                await asyncio.shield(server.ready)
            except BaseException:
                self.release(server)
                raise
            if server.process.exitcode is None:
                return server
            server.open -= 1  # it died as it became ready: once more

    def release(self, server: ModelServer) -> None:
        server.open -= 1
        if server.open == 0:
            self._went_idle(server)
        self._notify()

    def _went_idle(self, server: ModelServer) -> None:
        server.idle_since = self.clock()
        if server.state == LOADED and self.servers.get(names.key(server.entry.name)) is server:
            self._schedule_expiry(server)
            self._notify()

    async def load(self, name: str) -> ModelServer:
        """POST /models/load: starts `name` (if needed); it stays until unloaded or evicted to make room, as
        llama.cpp's router keeps it."""
        async with self.use(name, FOREVER) as server:
            return server

    def unload(self, name: str) -> bool:
        """Stops `name` once its requests in flight have ended (unless a later request keeps it); False if it was
        not loaded."""
        server = self.servers.get(names.key(name))
        if server is None:
            return False
        server.keep_alive_s = 0.0
        if server.open == 0:
            self._stop(server)
        return True

    def is_loaded(self, name: str) -> bool:
        return names.key(name) in self.servers

    # ---- starting and stopping

    async def _start(self, entry: ModelEntry) -> ModelServer:
        key = names.key(entry.name)
        await self._make_room(entry)
        if (server := self.servers.get(key)) is not None:  # another request started it while this one waited
            return server
        folder = pathlib.Path(tempfile.mkdtemp(prefix="tinyvllm-model-"))  # 0700
        name = names.short_name(entry.name)
        try:
            process, client = self._launch(entry, name, folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        url = self._urls.setdefault(key, f"http://model-{len(self._urls)}")  # a label: requests go by the socket
        server = ModelServer(name, entry, process, folder, client, Instance(url, STATIC, model=name, healthy=True))
        self.servers[key], self.by_url[url] = server, server
        log.info("model %s: starting its server (%s)", name, entry.source)
        asyncio.create_task(self._wait_ready(server))
        return server

    def _launch(self, entry: ModelEntry, name: str, folder: pathlib.Path) -> tuple[ChildProcess, httpx.AsyncClient]:
        """The (not yet started) process of `entry`'s server, listening in `folder`, and the client that reaches it."""
        engine = dataclasses.replace(self.engine, model=dataclasses.replace(self.engine.model, model=entry.source))
        if entry.adapter is not None:  # a Modelfile ADAPTER: the model's server runs its one adapter, at its rank
            engine = dataclasses.replace(engine, speculative_config=None, lora=LoRAConfig(
                enable_lora=True, max_lora_rank=adapter_rank(entry)))
        child = dataclasses.replace(self.child_server, host="127.0.0.1", port=0, uds=str(folder / "http.sock"),
                                    served_model_name=name, models_dir=str(self.store.folder), api_key=None,
                                    registration=None, allowed_origins=[])
        # its own session: a terminal's Ctrl-C reaches this process, which drains and then stops the models
        process = ChildProcess(f"tinyvllm-model {name}", "tinyvllm.frontend.api.server", engine.public(), child,
                               new_session=True)
        client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=child.uds), trust_env=False,
                                   timeout=httpx.Timeout(10.0, read=None, pool=None),
                                   limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return process, client

    async def _wait_ready(self, server: ModelServer) -> None:
        """Starts the server's process and resolves server.ready once it answers /health, or with why it did not."""
        started, deadline = time.monotonic(), time.monotonic() + self.child_server.startup_timeout_s
        try:
            if server.ready.done():  # unloaded before it started
                return
            server.process.start()
            while not server.ready.done():  # (done: unloaded while it loaded)
                if (code := server.process.exitcode) is not None:
                    raise ModelLoadError(f"model '{server.name}' failed to load: its server exited with code {code} "
                                         "(the server's log has the reason)")
                if time.monotonic() > deadline:
                    raise ModelLoadError(f"model '{server.name}' did not load within "
                                         f"{self.child_server.startup_timeout_s:g} s")
                with contextlib.suppress(httpx.TransportError):
                    if (await server.client.get("http://model/health")).status_code == 200:
                        server.state = LOADED
                        log.info("model %s: loaded in %.1f s (pid %d)", server.name, time.monotonic() - started,
                                 server.process.pid)
                        server.ready.set_result(server)
                        if server.open == 0:  # everyone who waited for it left: it idles from now
                            self._went_idle(server)
                        return
                await asyncio.sleep(HEALTH_POLL_S)
        except Exception as e:
            failure = e if isinstance(e, ModelLoadError) else ModelLoadError(f"model '{server.name}' failed to "
                                                                             f"load: {e!r}")
            if not server.ready.done():
                server.ready.set_exception(failure)
                server.ready.exception()  # retrieved: a load nobody waits for any more is no unhandled error
            self._stop(server)

    async def _make_room(self, entry: ModelEntry) -> None:
        """Stops idle models, least recently used first, until `entry` fits; waits while the only ones that could
        make room are busy."""
        while not self._fits(entry):
            if names.key(entry.name) in self.servers:  # another request started it meanwhile
                return
            idle = [s for s in self.servers.values() if s.open == 0 and s.state == LOADED]
            if idle:
                victim = min(idle, key=lambda s: s.idle_since)
                log.info("model %s: unloading it to make room for %s", victim.name, entry.name)
                await asyncio.shield(self._stop(victim))  # its memory is free once its processes are gone
                continue
            async with self._changed:
                await self._changed.wait()

    def _fits(self, entry: ModelEntry) -> bool:
        """Whether `entry` may start now: servers still stopping count as loaded (their memory is not free yet), and
        those loading as using what they will use."""
        if not self.servers and not self.stopping:
            return True
        if self.max_loaded:
            return len(self.servers) + len(self.stopping) < self.max_loaded
        coming = sum(self._needed_bytes(s.entry) for s in self.servers.values() if s.state != LOADED)
        return self._needed_bytes(entry) + coming <= self.free_memory()

    def _needed_bytes(self, entry: ModelEntry) -> int:
        engines = self.engine.world_size * self.engine.parallel.data_parallel_size
        weights = model_info.source_size(pathlib.Path(entry.source))
        return int(weights * 1.1) + engines * (self.engine.cache.kv_cache_memory + PROCESS_OVERHEAD_BYTES)

    def _schedule_expiry(self, server: ModelServer) -> None:
        self._cancel_expiry(server)
        if math.isinf(server.keep_alive_s):
            return
        if server.keep_alive_s <= 0:
            self._stop(server)
            return
        server.expiry = asyncio.get_running_loop().call_later(server.keep_alive_s, self._expire, server)

    def _expire(self, server: ModelServer) -> None:
        server.expiry = None
        if server.open == 0 and self.servers.get(names.key(server.entry.name)) is server:
            log.info("model %s: unloading it after %g s idle (keep_alive)", server.name, server.keep_alive_s)
            self._stop(server)

    @staticmethod
    def _cancel_expiry(server: ModelServer) -> None:
        if server.expiry is not None:
            server.expiry.cancel()
            server.expiry = None

    def _stop(self, server: ModelServer) -> asyncio.Task:
        """Forgets the server at once (a new request starts a new one) and stops its process in the background
        (the task returned)."""
        self._cancel_expiry(server)
        if not server.ready.done():
            server.ready.set_exception(ModelLoadError(f"model '{server.name}' was unloaded while it loaded"))
            server.ready.exception()
        key = names.key(server.entry.name)
        if self.servers.get(key) is server:
            del self.servers[key]
        if self.by_url.get(server.instance.url) is server:
            del self.by_url[server.instance.url]
        if server not in self.stopping:
            self.stopping[server] = asyncio.create_task(self._end_process(server))
        return self.stopping[server]

    async def _end_process(self, server: ModelServer) -> None:
        process = server.process
        process.terminate()  # SIGTERM: the server drains (nothing is open) and stops its engine's processes
        await asyncio.to_thread(process.join, self.child_server.shutdown_timeout_s + 10)
        if process.is_alive():
            process.kill()
            await asyncio.to_thread(process.join)
        await server.client.aclose()
        shutil.rmtree(server.folder, ignore_errors=True)
        log.info("model %s: unloaded (exit code %s)", server.name, process.exitcode)
        del self.stopping[server]
        self._notify()  # its memory is free now

    def _notify(self) -> None:
        async def notify():
            async with self._changed:
                self._changed.notify_all()
        asyncio.get_running_loop().create_task(notify())

    async def close(self) -> None:
        """Stops every model's server and waits until their processes are gone."""
        for server in list(self.servers.values()):
            self._stop(server)
        await asyncio.gather(*self.stopping.values(), return_exceptions=True)

    def kill_all(self) -> None:
        """Where close could not run (the event loop is gone): kills every model's server now."""
        for server in [*self.servers.values(), *self.stopping]:
            server.process.kill()
