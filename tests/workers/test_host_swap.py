"""CPU swap on a worker (workers/host_swap.py): a plan's swap-outs copy blocks to host memory before its block copies,
its swap-ins copy them back after, every layer's keys and values, and nothing else."""
import numpy as np
import pytest
from tinygrad import Tensor

from tests.workers.dense_reference import random_llama
from tests.workers.test_paged_attention import CFG
from tinyvllm.protocol.messages import StepPlan
from tinyvllm.workers.kv_block_io import KVBlockIO
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.model_runner import ModelRunner


def test_swap_out_then_copies_then_swap_in():
    cache = PagedKVCache(CFG, num_blocks=8, block_size=4)
    rng = np.random.default_rng(0)
    for layer in cache.layers:
        layer.assign(Tensor(rng.random(layer.shape, dtype=np.float32))).realize()
    block_bytes = KVBlockIO(cache).nbytes
    runner = ModelRunner(Transformer(CFG, random_llama(CFG), 64), cache, max_num_seqs=2, max_model_len=32,
                         max_num_batched_tokens=8, swap_space_bytes=3 * block_bytes + 1)
    assert runner.host_swap.num_slots == 3
    before = [layer.numpy().copy() for layer in cache.layers]
    # block 3 goes out before the copy overwrites it, and comes back in block 6 after: 6 holds 3's old keys
    runner.compute(StepPlan(1, [], [], [], block_copies=[[1, 3]], swap_out=[[3, 2], [4, 0]], swap_in=[[2, 6]]))
    runner.compute(StepPlan(2, [], [], [], swap_in=[[0, 7]]))
    bs = cache.block_size
    for b, a in zip(before, (layer.numpy() for layer in cache.layers)):
        for src, dst in ((1, 3), (3, 6), (4, 7)):
            np.testing.assert_array_equal(a[dst * bs:dst * bs + bs], b[src * bs:src * bs + bs])
        for untouched in (0, 1, 2, 4, 5, 8):  # 8 is the scratch block
            np.testing.assert_array_equal(a[untouched * bs:untouched * bs + bs], b[untouched * bs:untouched * bs + bs])
    with pytest.raises(ValueError, match="swap slot 3 is out of range"):
        runner.host_swap.swap_out([[1, 3]])
