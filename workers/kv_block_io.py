"""One KV block of every layer to and from host bytes, for the KV side channel (workers/kv_side_channel.py).

A block's bytes are its values, [layers, block_size, 2, kv_heads, head_dim] in the cache's storage dtype
(workers/kv_quant.py), then for an int8/fp8 cache its scales, [layers, block_size, 2, kv_heads] float32: each
layer's slots of that block, layer after layer. `parts` and `join` turn bytes into those arrays (axis 3: the kv
heads, which the side channel splits between tensor-parallel ranks) and back. Reading and writing are TinyJits
over a bound block id (like copy-on-write's block copy), so any block id runs one compiled graph."""
import numpy as np
from tinygrad import Tensor, TinyJit, UOp

from tinyvllm.workers.device_input import device_tensor
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.kv_quant import SCALE_DTYPE, numpy_storage_dtype

HEAD_AXIS = 3


class KVBlockIO:
    def __init__(self, cache: PagedKVCache):
        self.cache = cache
        first = cache.layers[0]
        self.shape = (len(cache.layers), cache.block_size, *first.shape[1:])  # the values'
        self.part_dtypes = [numpy_storage_dtype(cache.dtype)]  # the values', then the scales' (int8/fp8)
        if cache.scales:
            self.part_dtypes.append(np.dtype(SCALE_DTYPE.fmt))
        self.nbytes = len(self.join(self.empty_parts()))
        self.block_var = UOp.variable("kv_io_block", 0, cache.num_blocks - 1)
        self._read_jit, self._write_jit = TinyJit(self._read), TinyJit(self._write)

    def part_shapes(self, kv_heads: int | None = None) -> list[tuple[int, ...]]:
        """The values' shape, then the scales' (if any), for a block of kv_heads heads (default: all of them)."""
        values = (*self.shape[:HEAD_AXIS], self.shape[HEAD_AXIS] if kv_heads is None else kv_heads, self.shape[4])
        return [values, values[:-1]][:len(self.part_dtypes)]

    def empty_parts(self, kv_heads: int | None = None) -> list[np.ndarray]:
        return [np.zeros(s, d) for s, d in zip(self.part_shapes(kv_heads), self.part_dtypes)]

    def parts(self, data: bytes, kv_heads: int | None = None) -> list[np.ndarray]:
        """A block's bytes (of kv_heads heads) as arrays: the values, then the scales (if any)."""
        arrays, offset = [], 0
        for shape, dtype in zip(self.part_shapes(kv_heads), self.part_dtypes):
            count = int(np.prod(shape))
            arrays.append(np.frombuffer(data, dtype, count, offset).reshape(shape))
            offset += count * dtype.itemsize
        if offset != len(data):
            raise ValueError(f"a block of {len(data)} bytes, expected {offset}")
        return arrays

    @staticmethod
    def join(parts: list[np.ndarray]) -> bytes:
        return b"".join(np.ascontiguousarray(p).tobytes() for p in parts)

    def heads(self, data: bytes, start: int, stop: int) -> bytes:
        """The bytes of kv heads start..stop of a whole block's bytes."""
        return self.join([p[:, :, :, start:stop] for p in self.parts(data)])

    def _read(self, block: UOp) -> tuple[Tensor, ...]:
        bs = self.cache.block_size
        groups = [self.cache.layers, self.cache.scales][:len(self.part_dtypes)]
        outs = tuple(Tensor.stack(*[t[block * bs:block * bs + bs] for t in group]).contiguous() for group in groups)
        Tensor.realize(*outs)
        return outs

    def _write(self, block: UOp, *parts: Tensor) -> None:
        bs = self.cache.block_size
        for group, data in zip((self.cache.layers, self.cache.scales), parts):
            for i, t in enumerate(group):
                t[block * bs:block * bs + bs].assign(data[i])
        Tensor.realize(*self.cache.tensors)

    def check(self, block_id: int) -> None:
        if not 0 <= block_id < self.cache.num_blocks:
            raise ValueError(f"block {block_id} is out of range (0..{self.cache.num_blocks - 1})")

    def read(self, block_id: int) -> bytes:
        self.check(block_id)
        return self.join([t.numpy() for t in self._read_jit(self.block_var.bind(block_id))])

    def write(self, block_id: int, data: bytes) -> None:
        self.check(block_id)
        if len(data) != self.nbytes:
            raise ValueError(f"a block of {len(data)} bytes, expected {self.nbytes}")
        self._write_jit(self.block_var.bind(block_id), *[device_tensor(p) for p in self.parts(data)])
