"""A decode engine whose tensor-parallel size differs from its prefill engine's (workers/kv_pull.py): each decode rank
pulls the KV heads it holds from the prefill ranks that hold them, bit-exact, and a prefill rank's lease ends only
with the last of the releases it expects. In-process side channels on consecutive ports (rank q at port + q)."""
import dataclasses
import random
import threading

import numpy as np
import pytest
import zmq
from tinygrad import Tensor

from tests.e2e.server_process import wait_until
from tests.workers.test_paged_attention import CFG
from tinyvllm.protocol.kv_compat import kv_compat_fields, kv_compat_hash, tokens_hash
from tinyvllm.protocol.messages import KVLoad, KVTransferParams
from tinyvllm.workers.kv_block_io import KVBlockIO
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.kv_pull import KVSource, kv_sources, pull_blocks, release_ranks
from tinyvllm.workers.kv_side_channel import KVSideChannel

SECRET = "tp-test-secret-0123456789"
HASH = kv_compat_hash(kv_compat_fields("model-a", "float32", 4, CFG.n_layers, CFG.n_kv_heads, CFG.head_dim))
TOKENS = tokens_hash(list(range(7)))
REMOTE, LOCAL = [5, 2], [1, 3]


def test_which_prefill_ranks_each_decode_rank_pulls_from():
    assert kv_sources(2, 1, 2, 1) == [KVSource(0, range(1, 2), range(0, 1))]
    assert kv_sources(2, 2, 1, 0) == [KVSource(0, range(0, 1), range(0, 1)), KVSource(1, range(0, 1), range(1, 2))]
    assert kv_sources(4, 2, 1, 0) == [KVSource(0, range(0, 2), range(0, 2)), KVSource(1, range(0, 2), range(2, 4))]
    with pytest.raises(ValueError, match="cannot hold 4 KV heads"):
        kv_sources(4, 3, 1, 0)
    assert release_ranks(2, 1, 2) == {0: [0, 1]}
    # 2 KV heads on 4 prefill ranks: ranks 1 and 3 replicate what 0 and 2 hold; nobody pulls them, one releases them
    assert [s.prefill_rank for s in kv_sources(2, 4, 1, 0)] == [0, 2]
    assert release_ranks(2, 4, 1) == {0: [0], 1: [0], 2: [0], 3: [0]}


def random_cache(n_kv_heads: int, seed: int, dtype: str = "float32") -> PagedKVCache:
    """Random values (int8: random codes) and, for int8, random scales."""
    cache = PagedKVCache(dataclasses.replace(CFG, n_kv_heads=n_kv_heads), num_blocks=8, block_size=4, dtype=dtype)
    rng = np.random.default_rng(seed)
    for t in cache.tensors:
        data = rng.integers(-127, 128, t.shape).astype(np.int8) if dtype == "int8" and t.ndim == 4 else \
            rng.random(t.shape, dtype=np.float32)
        t.assign(Tensor(data)).realize()
    return cache


class PrefillEngine:
    """tp ranks' side channels at port + q, served from one thread (blocks read beforehand: tinygrad stays here)."""

    def __init__(self, ctx, tp: int, dtype: str = "float32"):
        self.caches = [random_cache(CFG.n_kv_heads // tp, seed=q, dtype=dtype) for q in range(tp)]
        self.released: list[tuple[int, str]] = []
        for _ in range(50):
            port = random.randint(20000, 60000)
            try:
                self.channels = [self._channel(ctx, q, port + q) for q in range(tp)]
                break
            except zmq.ZMQError:
                for channel in getattr(self, "channels", []):
                    channel.close()
        self.port, self.stop = port, threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _channel(self, ctx, q: int, port: int) -> KVSideChannel:
        io = KVBlockIO(self.caches[q])
        preread = type("Preread", (), {"nbytes": io.nbytes, "shape": io.shape, "heads": staticmethod(io.heads),
                                       "read": staticmethod({b: io.read(b) for b in REMOTE}.__getitem__)})
        channel = KVSideChannel(ctx, f"tcp://127.0.0.1:{port}", preread, HASH,
                                lambda rid, q=q: self.released.append((q, rid)), SECRET)
        channel.leases["r1"] = (list(REMOTE), TOKENS)
        return channel

    def _serve(self):
        while not self.stop.is_set():
            for channel in self.channels:
                if channel.sock.poll(5):
                    channel.handle()

    def heads(self) -> list[np.ndarray]:
        """Each remote block's keys and values of every head, the ranks' heads side by side, as [slot, 2, head, dim]
        (then the scales', [slot, 2, head], for an int8 cache)."""
        parts = range(len(self.caches[0].tensors))
        layers = [np.concatenate([c.tensors[i].numpy() for c in self.caches], axis=2) for i in parts]
        return [np.concatenate([layer[b * 4:b * 4 + 4] for b in REMOTE]) for layer in layers]

    def close(self):
        self.stop.set()
        self.thread.join()
        for channel in self.channels:
            channel.close()


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def load(engine: PrefillEngine, tp: int) -> KVLoad:
    return KVLoad("d1", list(LOCAL), KVTransferParams(do_remote_prefill=True, remote_block_ids=list(REMOTE),
                                                       remote_host="127.0.0.1", remote_port=engine.port,
                                                       remote_request_id="r1", tp_size=tp), TOKENS)


def pulled(cache: PagedKVCache) -> list[np.ndarray]:
    return [np.concatenate([t.numpy()[b * 4:b * 4 + 4] for b in LOCAL]) for t in cache.tensors]


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_two_prefill_ranks_into_one_decode_rank(ctx, dtype):
    """int8: each rank's codes and their scales (workers/kv_block_io.py) land at the decode rank's heads."""
    engine = PrefillEngine(ctx, tp=2, dtype=dtype)
    try:
        decode = PagedKVCache(CFG, num_blocks=6, block_size=4, dtype=dtype)
        pull_blocks(ctx, load(engine, 2), KVBlockIO(decode), HASH, CFG.n_kv_heads, 0, 1, secret=SECRET)
        for got, want in zip(pulled(decode), engine.heads()):
            assert np.array_equal(got, want)
        assert wait_until(lambda: sorted(engine.released) == [(0, "r1"), (1, "r1")], 3)
    finally:
        engine.close()


def test_one_prefill_rank_into_two_decode_ranks_and_the_lease_waits_for_both(ctx):
    engine = PrefillEngine(ctx, tp=1)
    try:
        halves = [PagedKVCache(dataclasses.replace(CFG, n_kv_heads=1), num_blocks=6, block_size=4) for _ in range(2)]
        pull_blocks(ctx, load(engine, 1), KVBlockIO(halves[0]), HASH, CFG.n_kv_heads, 0, 2, secret=SECRET)
        assert wait_until(lambda: engine.channels[0].releases == {"r1": 1}, 3)
        assert engine.released == [] and "r1" in engine.channels[0].leases  # rank 1 has not pulled yet
        pull_blocks(ctx, load(engine, 1), KVBlockIO(halves[1]), HASH, CFG.n_kv_heads, 1, 2, secret=SECRET)
        assert wait_until(lambda: engine.released == [(0, "r1")], 3)
        whole = engine.heads()
        for rank, half in enumerate(halves):
            for got, want in zip(pulled(half), whole):
                assert np.array_equal(got, want[:, :, rank:rank + 1])
    finally:
        engine.close()
