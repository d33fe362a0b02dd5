"""ModelServers' lifecycle with fake model servers (a process that "starts" when told, an httpx MockTransport for its
/health): one start for many waiting requests, keep_alive set by the last request to start, an unload that waits
for the requests in flight, room made from idle models only (least recently used first, never a busy or loading
one), a loading model that turns idle wakes the request waiting for room, a start that fails fails its waiters."""
import asyncio

import httpx
import pytest

from tinyvllm.frontend.api.ollama.model_store import ModelEntry, ModelStore
from tinyvllm.frontend.api.server_options import ServerArgs
from tinyvllm.frontend.router.model_servers import ModelLoadError, ModelServers
from tinyvllm.protocol.engine_config import EngineConfig

pytestmark = pytest.mark.anyio


class FakeProcess:
    def __init__(self, fail: bool = False):
        self.started = self.ready = self.killed = False
        self.exitcode, self.pid, self.fail = None, 1, fail

    def start(self):
        if self.fail:
            raise OSError("no more processes")
        self.started = True

    def is_alive(self):
        return self.started and self.exitcode is None

    def terminate(self):
        self.exitcode = 0 if self.started else None

    kill = terminate

    def join(self, timeout_s=None):
        pass


class FakeServers(ModelServers):
    def __init__(self, store, **kwargs):
        super().__init__(store, EngineConfig(), ServerArgs(startup_timeout_s=5), **kwargs)
        self.launched: list[tuple[str, FakeProcess]] = []
        self.failing: set[str] = set()

    def _launch(self, entry, name, folder):
        process = FakeProcess(fail=name in self.failing)
        self.launched.append((name, process))
        health = lambda request: httpx.Response(200 if process.ready else 503)
        return process, httpx.AsyncClient(transport=httpx.MockTransport(health))

    def process(self, name: str) -> FakeProcess:
        return [p for n, p in self.launched if n == name][-1]


@pytest.fixture
def store(tmp_path):
    store = ModelStore(tmp_path / "models", None, None, 0)
    for name in ("alpha", "beta", "gamma"):
        weights = tmp_path / f"{name}.gguf"
        weights.write_bytes(b"x" * 1000)
        store.put(ModelEntry(f"{name}:latest", str(weights)))
    return store


async def until(predicate, timeout_s: float = 5.0):
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_requests_waiting_for_a_cold_model_share_one_start_and_one_server(store):
    servers = FakeServers(store, keep_alive_s=60, max_loaded=1)
    waiting = [asyncio.create_task(servers.acquire("alpha", 60)) for _ in range(3)]
    await until(lambda: servers.launched)
    servers.process("alpha").ready = True
    got = await asyncio.gather(*waiting)
    assert len({id(s) for s in got}) == 1 and [n for n, _ in servers.launched] == ["alpha"]
    for server in got:
        servers.release(server)
    await servers.close()


async def test_keep_alive_of_the_last_request_to_start_and_unload_waits_for_the_busy(store):
    servers = FakeServers(store, keep_alive_s=60)
    first = asyncio.create_task(servers.acquire("alpha", 0))
    await until(lambda: servers.launched)
    servers.process("alpha").ready = True
    server = await first
    later = await servers.acquire("alpha", 60)  # started later: its keep_alive wins
    servers.release(server)
    servers.release(later)
    assert servers.is_loaded("alpha") and server.expires_at is not None
    busy = await servers.acquire("alpha", 60)
    assert servers.unload("alpha") and servers.is_loaded("alpha")  # not while a request runs
    servers.release(busy)
    assert not servers.is_loaded("alpha")
    await until(lambda: not servers.stopping)
    assert servers.process("alpha").exitcode == 0
    assert not servers.unload("alpha")
    await servers.close()


async def test_room_comes_from_the_least_recently_used_idle_model_never_a_busy_one(store):
    servers = FakeServers(store, keep_alive_s=60, max_loaded=2)
    loaded = {}
    for name in ("alpha", "beta"):
        task = asyncio.create_task(servers.acquire(name, 60))
        await until(lambda: any(n == name for n, _ in servers.launched))
        servers.process(name).ready = True
        loaded[name] = await task
    servers.release(loaded["alpha"])  # idle since now; beta stays busy
    gamma = asyncio.create_task(servers.acquire("gamma", 60))
    await until(lambda: any(n == "gamma" for n, _ in servers.launched))
    assert not servers.is_loaded("alpha") and servers.is_loaded("beta")
    servers.process("gamma").ready = True
    servers.release(await gamma)
    # now beta is the only busy one and gamma idle: another start takes gamma's place, not beta's
    alpha = asyncio.create_task(servers.acquire("alpha", 60))
    await until(lambda: sum(n == "alpha" for n, _ in servers.launched) == 2)
    assert servers.is_loaded("beta") and not servers.is_loaded("gamma")
    servers.process("alpha").ready = True
    servers.release(await alpha)
    servers.release(loaded["beta"])
    await servers.close()


async def test_a_loading_model_whose_waiters_left_makes_room_at_once(store):
    servers = FakeServers(store, keep_alive_s=600, max_loaded=1)
    leaving = asyncio.create_task(servers.acquire("alpha", 600))
    await until(lambda: servers.launched)
    leaving.cancel()  # its client gave up while alpha loaded
    beta = asyncio.create_task(servers.acquire("beta", 60))
    await asyncio.sleep(0.05)
    servers.process("alpha").ready = True  # idle once loaded: beta must not wait for alpha's 600 s
    await until(lambda: any(n == "beta" for n, _ in servers.launched))
    servers.process("beta").ready = True
    servers.release(await beta)
    await servers.close()


async def test_a_start_that_fails_fails_every_waiter_and_the_next_request_starts_again(store):
    servers = FakeServers(store, keep_alive_s=60)
    servers.failing.add("alpha")
    waiting = [asyncio.create_task(servers.acquire("alpha", 60)) for _ in range(2)]
    for task in waiting:
        with pytest.raises(ModelLoadError, match="no more processes"):
            await task
    assert not servers.is_loaded("alpha")
    servers.failing.clear()
    task = asyncio.create_task(servers.acquire("alpha", 60))
    await until(lambda: len(servers.launched) == 2)
    servers.process("alpha").ready = True
    servers.release(await task)
    await servers.close()


async def test_memory_counts_models_still_loading(store):
    free = [2500 + 2 * (EngineConfig().cache.kv_cache_memory + (512 << 20))]  # room for two models, not three
    servers = FakeServers(store, keep_alive_s=60, free_memory=lambda: free[0])
    tasks = [asyncio.create_task(servers.acquire(name, 60)) for name in ("alpha", "beta", "gamma")]
    await until(lambda: len(servers.launched) == 2)
    await asyncio.sleep(0.05)
    assert [n for n, _ in servers.launched] == ["alpha", "beta"]  # gamma waits: two loading ones take the room
    for name in ("alpha", "beta"):
        servers.process(name).ready = True
    for task in tasks[:2]:
        servers.release(await task)  # idle: gamma may now evict one
    await until(lambda: len(servers.launched) == 3)
    servers.process("gamma").ready = True
    servers.release(await tasks[2])
    await servers.close()


def test_a_stored_models_adapter_sizes_its_servers_slots_or_fails_its_load(tmp_path):
    from tests.helpers.tiny_lora import make_llama_with_adapters
    from tests.helpers.tiny_model import make_tiny_gguf
    from tinyvllm.frontend.router.model_servers import adapter_rank
    base, adapters, _ = make_llama_with_adapters(tmp_path, vocab_size=128, tokenizer=False)
    assert adapter_rank(ModelEntry("m:latest", str(base), adapter=str(adapters["small"][0]))) == 8
    assert adapter_rank(ModelEntry("m:latest", str(base), adapter=str(adapters["wide"][0]))) == 16
    other = make_tiny_gguf(tmp_path / "other.gguf", dim=32)  # another model's shapes
    with pytest.raises(ModelLoadError, match="cannot load its adapter.*does not fit"):
        adapter_rank(ModelEntry("m:latest", str(other), adapter=str(adapters["small"][0])))
