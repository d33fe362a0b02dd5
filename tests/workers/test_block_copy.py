"""Copy-on-write support: copying block src to block dst copies every layer's keys and values, and nothing else."""
import numpy as np
from tinygrad import Tensor

from tests.workers.dense_reference import random_llama
from tests.workers.test_paged_attention import CFG
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.model_runner import ModelRunner


def test_copy_blocks_copies_every_layer_and_only_the_targets():
    cache = PagedKVCache(CFG, num_blocks=8, block_size=4)
    rng = np.random.default_rng(0)
    for layer in cache.layers:
        layer.assign(Tensor(rng.random(layer.shape, dtype=np.float32))).realize()
    runner = ModelRunner(Transformer(CFG, random_llama(CFG), 64), cache, max_num_seqs=2, max_model_len=32,
                         max_num_batched_tokens=8)
    before = [layer.numpy().copy() for layer in cache.layers]
    pairs = [[1, 5], [2, 6], [3, 0], [7, 4]]  # more pairs than one jit capture: replays must rebind src/dst
    runner.copy_blocks(pairs)
    bs = cache.block_size
    for b, a in zip(before, (layer.numpy() for layer in cache.layers)):
        for src, dst in pairs:
            np.testing.assert_array_equal(a[dst * bs:dst * bs + bs], b[src * bs:src * bs + bs])
        for untouched in (1, 2, 3, 7, 8):  # 8 is the scratch block
            np.testing.assert_array_equal(a[untouched * bs:untouched * bs + bs], b[untouched * bs:untouched * bs + bs])
