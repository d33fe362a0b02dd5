"""The paged KV cache: per layer one preallocated tensor of (num_blocks + 1) * block_size slots.

Block ids are the scheduler's; the extra last block is scratch space that padding rows of a
fixed-size batch write into, so a jitted step never needs a branch for "no slot".
"""
from tinygrad import Tensor, dtypes

from tinyvllm.protocol.model_config import ModelConfig

BYTES_PER_ELEMENT = dtypes.float32.itemsize


def bytes_per_block(cfg: ModelConfig, block_size: int) -> int:
    return 2 * cfg.n_layers * block_size * cfg.n_kv_heads * cfg.head_dim * BYTES_PER_ELEMENT


def blocks_for_budget(cfg: ModelConfig, block_size: int, budget_bytes: int) -> int:
    return budget_bytes // bytes_per_block(cfg, block_size)


class PagedKVCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int):
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch_block = num_blocks
        self.num_slots = (num_blocks + 1) * block_size
        # [slot, k-or-v, kv_head, head_dim]: one token's keys and values are adjacent, so a write is one copy
        self.layers = [Tensor.zeros(self.num_slots, 2, cfg.n_kv_heads, cfg.head_dim, dtype=dtypes.float32).contiguous().realize()
                       for _ in range(cfg.n_layers)]

    @property
    def scratch_slot(self) -> int:
        return self.scratch_block * self.block_size
