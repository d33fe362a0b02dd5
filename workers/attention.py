"""Paged attention in tinygrad ops: write the step's keys/values into their slots, then attend over the
sequence's blocks gathered through its block table, up to a symbolic number of blocks `nb`.

Writes touch only the step's slots (workers/kv_write.py: one kernel per layer), never the whole cache, so
their cost does not grow with the cache size.
"""
from tinygrad import Tensor, UOp, dtypes

from tinyvllm.workers.cpu_attention import cpu_decode_attention, cpu_prefill_attention
from tinyvllm.workers.cpu_attention import supports as supports_cpu_attention
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.kv_write import decode_slots, prefill_slots, write_kv


def gqa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """q [B, T, H, D]; k, v [B, S, KVH, D]; mask [B, T, S] (True = attend) -> [B, T, H*D]."""
    B, T, H, D = q.shape
    KVH = k.shape[2]
    q = q.reshape(B, T, KVH, H // KVH, D).permute(0, 2, 3, 1, 4)  # [B, KVH, G, T, D]
    k, v = k.permute(0, 2, 1, 3).unsqueeze(2), v.permute(0, 2, 1, 3).unsqueeze(2)  # [B, KVH, 1, S, D]
    scores = (q @ k.transpose(-1, -2)) * (1.0 / D ** 0.5)
    scores = mask.reshape(B, 1, 1, T, mask.shape[-1]).where(scores, -float("inf"))
    out = scores.softmax(-1) @ v  # [B, KVH, G, T, D]
    return out.permute(0, 3, 1, 2, 4).reshape(B, T, H * D)


def block_slots(block_table: Tensor, block_size: int) -> Tensor:
    """[..., nb] block ids -> [..., nb * block_size] slot ids, in logical (position) order."""
    slots = block_table.unsqueeze(-1) * block_size + Tensor.arange(block_size, dtype=dtypes.int32)
    return slots.reshape(*block_table.shape[:-1], block_table.shape[-1] * block_size)


class DecodeAttention:
    """B sequences, one new token each. Row b sees context_lens[b] tokens, which lie in the first nb blocks of its
    row of block_tables; its new token is the last of them. cpu_kernels: attend with workers/cpu_attention.py's
    kernel."""

    def __init__(self, cache: PagedKVCache, block_tables: Tensor, nb: UOp, context_lens: Tensor, cpu_kernels: bool = False):
        self.cache, self.block_tables, self.context_lens = cache, block_tables, context_lens
        self.write_slots = decode_slots(block_tables, context_lens, cache.block_size)
        self.slots = block_slots(block_tables[:, :nb], cache.block_size)  # [B, S]
        S = self.slots.shape[1]
        self.mask = (Tensor.arange(S, dtype=dtypes.int32).reshape(1, 1, S) < context_lens.reshape(-1, 1, 1))
        self.cpu_kernels = cpu_kernels

    def __call__(self, layer: int, q: Tensor, kv: Tensor) -> Tensor:
        cache = write_kv(self.cache.layers[layer], kv, self.write_slots)
        if self.cpu_kernels and supports_cpu_attention(q.shape[1], kv.shape[2], q.shape[2]):
            return cpu_decode_attention(q, cache, self.block_tables, self.context_lens, self.cache.block_size)
        ctx = cache[self.slots]  # [B, S, 2, KVH, D]
        return gqa_attention(q.unsqueeze(1), ctx[:, :, 0], ctx[:, :, 1], self.mask).squeeze(1)


class PrefillAttention:
    """One sequence, a chunk of T (padded) tokens at positions start .. start+T-1, of which n_valid are real.
    The keys and values it attends over lie in the first nb blocks of block_table. cpu_kernels: as DecodeAttention."""

    def __init__(self, cache: PagedKVCache, block_table: Tensor, nb: UOp, start: Tensor, n_valid: Tensor, T: int,
                 cpu_kernels: bool = False):
        self.cache, self.block_table, self.start, self.cpu_kernels = cache, block_table, start, cpu_kernels
        self.write_slots = prefill_slots(block_table, start, n_valid, T, cache.block_size, cache.scratch_slot)
        self.slots = block_slots(block_table[:nb], cache.block_size)  # [S]

    def __call__(self, layer: int, q: Tensor, kv: Tensor) -> Tensor:
        cache, bs, T = write_kv(self.cache.layers[layer], kv, self.write_slots), self.cache.block_size, q.shape[0]
        if self.cpu_kernels and supports_cpu_attention(q.shape[1], kv.shape[2], q.shape[2]):
            return cpu_prefill_attention(q, cache, self.block_table, self.start, bs)
        ctx = cache[self.slots]  # [S, 2, KVH, D]
        S = ctx.shape[0]
        positions = self.start + Tensor.arange(T, dtype=dtypes.int32)
        mask = Tensor.arange(S, dtype=dtypes.int32).reshape(1, S) <= positions.reshape(T, 1)
        return gqa_attention(q.unsqueeze(0), ctx[:, 0].unsqueeze(0), ctx[:, 1].unsqueeze(0), mask.unsqueeze(0)).squeeze(0)
