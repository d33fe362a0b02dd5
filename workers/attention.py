"""Paged attention over a flat token batch: write the step's keys/values into their slots, then let each token
attend over its own sequence's context, through that sequence's block table, up to its own position.

Token t belongs to the sequence whose block table is row token_rows[t] of `tables` and sits at positions[t]; it
sees that sequence's positions 0..positions[t] (causal within a prompt chunk, the whole context for a decode).
Decodes and prompt chunks of many requests are the same thing here: tokens. The cache's values are converted to
float32 (and scaled, for int8/fp8) inside the attention, never copied back whole (workers/kv_quant.py). Writes
touch only the step's slots (workers/kv_write.py: one kernel per layer), never the whole cache, so their cost does
not grow with the cache.
"""
from tinygrad import Tensor, UOp, dtypes

from tinyvllm.protocol.kernel_choice import KernelChoice
from tinyvllm.workers.attention_spec import AttentionSpec
from tinyvllm.workers.cpu_attention import cpu_paged_attention
from tinyvllm.workers.cpu_attention import supports as supports_cpu_attention
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.kv_quant import dequantize
from tinyvllm.workers.kv_write import token_slots, write_layer
from tinyvllm.workers.paged_products import paged_attention_in_place

# tinygrad's kernels on a device with local memory (a GPU) read the cache in place (benchmarks/step_schedule.py turns
# this off to count the gathered path they replaced)
READ_IN_PLACE = True


def gqa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, spec: AttentionSpec | None = None,
                  sinks: Tensor | None = None) -> Tensor:
    """q [B, T, H, D]; k, v [B, S, KVH, D]; mask [B, T, S] (True = attend) -> [B, T, H*D]. sinks [H]: a logit per
    head that joins each softmax and weighs no value (gpt-oss)."""
    B, T, H, D = q.shape
    KVH = k.shape[2]
    q = q.reshape(B, T, KVH, H // KVH, D).permute(0, 2, 3, 1, 4)  # [B, KVH, G, T, D]
    k, v = k.permute(0, 2, 1, 3).unsqueeze(2), v.permute(0, 2, 1, 3).unsqueeze(2)  # [B, KVH, 1, S, D]
    spec = spec or AttentionSpec.plain(D)
    scores = (q @ k.transpose(-1, -2)) * spec.scale
    if spec.softcap:
        scores = (scores / spec.softcap).tanh() * spec.softcap
    scores = mask.reshape(B, 1, 1, T, mask.shape[-1]).where(scores, -float("inf"))
    if sinks is None:
        weights = scores.softmax(-1)
    else:
        sink = sinks.reshape(1, KVH, H // KVH, 1, 1).expand(B, KVH, H // KVH, T, 1)
        weights = scores.cat(sink, dim=-1).softmax(-1)[..., :-1]
    out = weights @ v  # [B, KVH, G, T, D]
    return out.permute(0, 3, 1, 2, 4).reshape(B, T, H * D)


def block_slots(block_table: Tensor, block_size: int) -> Tensor:
    """[..., nb] block ids -> [..., nb * block_size] slot ids, in logical (position) order."""
    slots = block_table.unsqueeze(-1) * block_size + Tensor.arange(block_size, dtype=dtypes.int32)
    return slots.reshape(*block_table.shape[:-1], block_table.shape[-1] * block_size)


class PagedAttention:
    """One step's attention: tables [R, max_blocks] int32 (a row per sequence), token_rows/positions [T] int32, of
    which the first n_valid ([1] int32) tokens are real (the padding writes to the scratch block); every position
    attended lies in the first nb blocks of its row. specs: each layer's AttentionSpec (default: plain attention).
    kernels: the model's KernelChoice; its attention "c" takes workers/cpu_attention.py's kernel (None: tinygrad's)."""

    def __init__(self, cache: PagedKVCache, tables: Tensor, token_rows: Tensor, positions: Tensor, n_valid: Tensor,
                 nb: UOp, kernels: KernelChoice | None = None, specs: list[AttentionSpec] | None = None):
        self.cache, self.tables, self.token_rows, self.positions = cache, tables, token_rows, positions
        self.specs = specs
        self.c_attention = kernels is not None and kernels.attention == "c"
        # on tinygrad's CPU backend the gathered path stays (its buffers follow the step's context; the in-place
        # scores buffer holds max_model_len positions per captured step, which loaded the CI machine's memory)
        self.in_place = READ_IN_PLACE and kernels is not None and kernels.gpu_matvec
        self.write_slots = token_slots(tables, token_rows, positions, n_valid, cache.block_size, cache.scratch_slot)
        self.nb = nb

    def __call__(self, layer: int, q: Tensor, kv: Tensor, sinks: Tensor | None = None) -> Tensor:
        """sinks: gpt-oss's attention sinks ([heads])."""
        values, scales = write_layer(self.cache, layer, kv, self.write_slots)
        bs, dtype = self.cache.block_size, self.cache.dtype
        spec = self.specs[layer] if self.specs else AttentionSpec.plain(q.shape[2])
        if self.c_attention and supports_cpu_attention(q.shape[1], kv.shape[2], q.shape[2]):
            return cpu_paged_attention(q, values, self.tables, self.token_rows, self.positions, bs, dtype, scales, spec,
                                       sinks)
        if self.in_place:  # reading the cache in place, whatever its dtype (workers/paged_products.py)
            return paged_attention_in_place(q, values, self.tables, self.token_rows, self.positions, self.nb, bs, dtype,
                                            spec, sinks, scales=scales)
        # tinygrad's CPU backend: each token gathers its sequence's first nb blocks and masks the positions after its own
        slots = block_slots(self.tables[self.token_rows][:, :self.nb], bs)  # [T, S]
        ctx = dequantize(values[slots], None if scales is None else scales[slots], dtype)  # [T, S, 2, KVH, D]
        S = slots.shape[1]
        key_positions, positions = Tensor.arange(S, dtype=dtypes.int32).reshape(1, 1, S), self.positions.reshape(-1, 1, 1)
        mask, values = key_positions <= positions, ctx[:, :, 1]
        if spec.window:  # blocks behind it may be another request's by now: not even a 0 * inf may reach the sum
            mask = mask & (key_positions > positions - spec.window)
            values = mask.reshape(-1, S, 1, 1).where(values, 0.0)
        return gqa_attention(q.unsqueeze(1), ctx[:, :, 0], values, mask, spec, sinks).squeeze(1)
