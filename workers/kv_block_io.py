"""One KV block of every layer to and from host bytes, for the KV side channel (workers/kv_side_channel.py).

A block's bytes are [layers, block_size, 2, kv_heads, head_dim] float32: each layer's slots of that block, layer after
layer. Reading and writing are TinyJits over a bound block id (like copy-on-write's block copy), so any block id runs
one compiled graph."""
import numpy as np
from tinygrad import Tensor, TinyJit, UOp

from tinyvllm.workers.device_input import device_tensor
from tinyvllm.workers.kv_cache import PagedKVCache


class KVBlockIO:
    def __init__(self, cache: PagedKVCache):
        self.cache = cache
        first = cache.layers[0]
        self.shape = (len(cache.layers), cache.block_size, *first.shape[1:])
        self.nbytes = int(np.prod(self.shape)) * 4
        self.block_var = UOp.variable("kv_io_block", 0, cache.num_blocks - 1)
        self._read_jit, self._write_jit = TinyJit(self._read), TinyJit(self._write)

    def _read(self, block: UOp) -> Tensor:
        bs = self.cache.block_size
        return Tensor.stack(*[layer[block * bs:block * bs + bs] for layer in self.cache.layers]).contiguous().realize()

    def _write(self, block: UOp, data: Tensor) -> None:
        bs = self.cache.block_size
        for i, layer in enumerate(self.cache.layers):
            layer[block * bs:block * bs + bs].assign(data[i])
        Tensor.realize(*self.cache.layers)

    def check(self, block_id: int) -> None:
        if not 0 <= block_id < self.cache.num_blocks:
            raise ValueError(f"block {block_id} is out of range (0..{self.cache.num_blocks - 1})")

    def read(self, block_id: int) -> bytes:
        self.check(block_id)
        return self._read_jit(self.block_var.bind(block_id)).numpy().tobytes()

    def write(self, block_id: int, data: bytes) -> None:
        self.check(block_id)
        if len(data) != self.nbytes:
            raise ValueError(f"a block of {len(data)} bytes, expected {self.nbytes}")
        self._write_jit(self.block_var.bind(block_id), device_tensor(np.frombuffer(data, np.float32).reshape(self.shape)))
