"""The KV side channel (workers/kv_side_channel.py) between two in-process endpoints: a decode cache pulls blocks of
a prefill cache, bit-exact, into other block ids; a compatibility mismatch, a pull of blocks not leased, another KV
secret, a silent peer and one that is gone are explicit errors; the puller's release reaches the prefill side. The prefill side is served from a thread with the blocks read beforehand
(tinygrad runs in one thread: in a worker the channel is served between steps)."""
import threading
import time

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
from tinyvllm.protocol.kv_release import release_remote_kv
from tinyvllm.workers.kv_pull import KVPullError, pull_blocks
from tinyvllm.workers.kv_side_channel import KVSideChannel

SECRET = "s" * 32
TOKENS = tokens_hash([5, 6, 7])
HASH = kv_compat_hash(kv_compat_fields("model-a", "float32", 4, CFG.n_layers, CFG.n_kv_heads, CFG.head_dim))


class PrereadBlocks:
    def __init__(self, io: KVBlockIO, block_ids):
        self.nbytes, self.shape, self.blocks = io.nbytes, io.shape, {b: io.read(b) for b in block_ids}

    def read(self, block_id):
        if block_id not in self.blocks:
            raise ValueError(f"block {block_id} is out of range")
        return self.blocks[block_id]


@pytest.fixture
def prefill_side():
    cache = PagedKVCache(CFG, num_blocks=8, block_size=4)
    rng = np.random.default_rng(1)
    for layer in cache.layers:
        layer.assign(Tensor(rng.random(layer.shape, dtype=np.float32))).realize()
    ctx = zmq.Context()
    released = []
    channel = KVSideChannel(ctx, "tcp://127.0.0.1:0", PrereadBlocks(KVBlockIO(cache), range(8)), HASH, released.append,
                            SECRET)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            if channel.sock.poll(20):
                channel.handle()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield cache, channel, released, ctx
    stop.set()
    thread.join()
    channel.close()
    ctx.destroy(linger=0)


def load_for(channel, remote_blocks, local_blocks, request_id="r1", leased=True):
    """A load of remote_blocks, which the prefill side leased under request_id (as a StepPlan's kv_leases would)."""
    if leased:
        channel.leases[request_id] = (list(remote_blocks), TOKENS)
    port = int(channel.address.rsplit(":", 1)[1])
    params = KVTransferParams(do_remote_prefill=True, remote_block_ids=remote_blocks, remote_host="127.0.0.1",
                              remote_port=port, remote_request_id=request_id)
    return KVLoad("local-id", local_blocks, params, TOKENS)


def test_blocks_arrive_bit_exact_and_the_release_reaches_the_prefill_side(prefill_side):
    p_cache, channel, released, ctx = prefill_side
    d_cache = PagedKVCache(CFG, num_blocks=6, block_size=4)
    before = [layer.numpy().copy() for layer in d_cache.layers]
    remote, local = [5, 2, 7], [0, 3, 4]
    pull_blocks(ctx, load_for(channel, remote, local), KVBlockIO(d_cache), HASH, CFG.n_kv_heads, secret=SECRET)
    bs = 4
    for p_layer, d_layer, old in zip(p_cache.layers, d_cache.layers, before):
        p, d = p_layer.numpy(), d_layer.numpy()
        for src, dst in zip(remote, local):
            assert np.array_equal(d[dst * bs:dst * bs + bs], p[src * bs:src * bs + bs])
        for untouched in (1, 2, 5, 6):  # 6 is the scratch block
            assert np.array_equal(d[untouched * bs:untouched * bs + bs], old[untouched * bs:untouched * bs + bs])
    assert wait_until(lambda: released == ["r1"], 10)
    assert channel.num_blocks_sent == 3 and "r1" not in channel.leases
    with pytest.raises(KVPullError, match="no lease on these blocks for r1"):  # a replay reads nothing
        pull_blocks(ctx, load_for(channel, remote, local, leased=False), KVBlockIO(d_cache), HASH, CFG.n_kv_heads, secret=SECRET)


def test_a_compatibility_mismatch_is_refused_with_what_differs(prefill_side):
    _, channel, released, ctx = prefill_side
    other = kv_compat_hash(kv_compat_fields("model-a", "float32", 16, CFG.n_layers, CFG.n_kv_heads, CFG.head_dim))
    d_cache = PagedKVCache(CFG, num_blocks=6, block_size=4)
    with pytest.raises(KVPullError, match="block_size: 4 here, 16 there"):
        pull_blocks(ctx, load_for(channel, [1], [0]), KVBlockIO(d_cache), other, CFG.n_kv_heads, secret=SECRET)
    assert wait_until(lambda: released == ["r1"], 10)  # released anyway: the prefill side need not wait for its lease


def test_a_block_out_of_range_and_a_silent_peer_are_errors(prefill_side):
    _, channel, _, ctx = prefill_side
    d_io = KVBlockIO(PagedKVCache(CFG, num_blocks=6, block_size=4))
    with pytest.raises(KVPullError, match="out of range"):
        pull_blocks(ctx, load_for(channel, [1, 99], [0, 1]), d_io, HASH, CFG.n_kv_heads, secret=SECRET)
    silent = ctx.socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    load = load_for(channel, [1], [0])
    load.remote.remote_port = port
    with pytest.raises(KVPullError, match="no answer"):
        pull_blocks(ctx, load, d_io, HASH, CFG.n_kv_heads, deadline=time.monotonic() + 0.3,
                    secret=SECRET)
    silent.close(linger=0)


def test_blocks_not_leased_and_strangers_are_refused(prefill_side):
    _, channel, released, ctx = prefill_side
    d_io = KVBlockIO(PagedKVCache(CFG, num_blocks=6, block_size=4))
    channel.leases["r1"] = ([1, 2], TOKENS)
    with pytest.raises(KVPullError, match="no lease on these blocks"):  # other blocks than the lease's
        pull_blocks(ctx, load_for(channel, [1, 3], [0, 1], leased=False), d_io, HASH, CFG.n_kv_heads, secret=SECRET)
    with pytest.raises(KVPullError, match="no lease on these blocks for r2"):
        pull_blocks(ctx, load_for(channel, [1, 2], [0, 1], "r2", leased=False), d_io, HASH, CFG.n_kv_heads,
                    secret=SECRET)
    assert wait_until(lambda: released == ["r1", "r2"], 10)  # a failed pull releases too (r1's lease ended with it)
    with pytest.raises(KVPullError, match="same --kv-secret"):
        pull_blocks(ctx, load_for(channel, [1, 2], [0, 1]), d_io, HASH, CFG.n_kv_heads, secret="t" * 32)
    time.sleep(0.3)  # the stranger's release arrives meanwhile, and is dropped
    assert released == ["r1", "r2"] and channel.leases == {"r1": ([1, 2], TOKENS)} and channel.num_blocks_sent == 0


def test_a_prefill_worker_that_is_gone_fails_the_pull_at_once(prefill_side):
    _, channel, _, ctx = prefill_side
    gone = ctx.socket(zmq.ROUTER)
    port = gone.bind_to_random_port("tcp://127.0.0.1")
    gone.close(linger=0)
    load = load_for(channel, [1], [0])
    load.remote.remote_port = port
    with pytest.raises(KVPullError, match="nothing listens there"):
        pull_blocks(ctx, load, KVBlockIO(PagedKVCache(CFG, num_blocks=6, block_size=4)), HASH, CFG.n_kv_heads,
                    deadline=time.monotonic() + 600, secret=SECRET)


def test_a_decode_request_that_ends_before_its_pull_releases_the_lease(prefill_side):
    _, channel, released, ctx = prefill_side
    remote = load_for(channel, [4, 5], [0, 1], "r3").remote
    release_remote_kv(ctx, remote, SECRET)
    assert wait_until(lambda: released == ["r3"], 10)
    assert "r3" not in channel.leases


def test_other_tokens_a_stranger_host_and_junk_are_refused(prefill_side):
    _, channel, released, ctx = prefill_side
    d_io = KVBlockIO(PagedKVCache(CFG, num_blocks=6, block_size=4))
    other = load_for(channel, [1, 2], [0, 1])
    other.tokens_hash = tokens_hash([5, 6, 8])  # another prompt of the same length
    with pytest.raises(KVPullError, match="computed for other tokens"):
        pull_blocks(ctx, other, d_io, HASH, CFG.n_kv_heads, secret=SECRET)
    assert wait_until(lambda: released == ["r1"], 10)  # that release ended the lease: the pull below leases anew
    far = load_for(channel, [1, 2], [0, 1])
    far.remote.remote_host = "10.0.0.9"
    with pytest.raises(KVPullError, match="needs a KV secret"):  # anyone there could answer
        pull_blocks(ctx, far, d_io, HASH, CFG.n_kv_heads, secret="")
    bad = load_for(channel, [1, 2], [0, 1])
    bad.remote.remote_host = "bad host"
    with pytest.raises(KVPullError, match="bad host"):  # a failed request, not a failed worker
        pull_blocks(ctx, bad, d_io, HASH, CFG.n_kv_heads, secret=SECRET)
    junk = ctx.socket(zmq.DEALER)
    junk.connect(channel.address)
    junk.send(b"x" * (2 << 20))  # over the channel's message bound: ZMQ drops it (and this peer)
    pull_blocks(ctx, load_for(channel, [1, 2], [0, 1]), d_io, HASH, CFG.n_kv_heads, secret=SECRET)  # still serving
    junk.close(linger=0)
