"""The paged KV cache: per layer one preallocated tensor of (num_blocks + 1) * block_size slots.

Block ids are the scheduler's; the extra last block is scratch space that padding rows of a
fixed-size batch write into, so a jitted step never needs a branch for "no slot".
Each layer's values are stored in the cache's dtype (workers/kv_quant.py); a quantised cache (int8, fp8) also
has per layer a float32 scale per slot, k-or-v and kv head.
"""
from tinygrad import Device, Tensor

from tinyvllm.protocol.kv_cache_dtype import resolve_kv_cache_dtype
from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.workers.kernel_set import default_kernel_set
from tinyvllm.workers.kv_quant import SCALE_DTYPE, is_quantized, storage_dtype


def cache_dtype(name: str, kernels: str | None = None) -> str:
    """What a cache asked for as `name` stores on this process's device for a model of the kernel set `kernels`
    (None: the device's default set)."""
    return resolve_kv_cache_dtype(name, Device.DEFAULT, kernels or default_kernel_set(Device.DEFAULT))


def bytes_per_slot(cfg: ModelConfig, dtype: str = "float32") -> int:
    """One token's keys and values in every layer, their scales included."""
    dtype = cache_dtype(dtype)
    per_head = cfg.head_dim * storage_dtype(dtype).itemsize + (SCALE_DTYPE.itemsize if is_quantized(dtype) else 0)
    return 2 * cfg.n_layers * cfg.n_kv_heads * per_head


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: str = "float32") -> int:
    return block_size * bytes_per_slot(cfg, dtype)


class PagedKVCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: str = "float32"):
        """dtype: one of protocol/kv_cache_dtype.KV_CACHE_DTYPES (auto: what it resolves to under the device's
        default kernel set; cache_dtype resolves it for another)."""
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.dtype = cache_dtype(dtype)
        self.scratch_block = num_blocks
        self.num_slots = (num_blocks + 1) * block_size
        # [slot, k-or-v, kv_head, head_dim]: one token's keys and values are adjacent, so a write is one copy
        self.layers = [Tensor.zeros(self.num_slots, 2, cfg.n_kv_heads, cfg.head_dim, dtype=storage_dtype(self.dtype))
                       .contiguous().realize() for _ in range(cfg.n_layers)]
        # [slot, k-or-v, kv_head]: the scale of that head's head_dim codes (quantised dtypes only)
        self.scales = [Tensor.zeros(self.num_slots, 2, cfg.n_kv_heads, dtype=SCALE_DTYPE).contiguous().realize()
                       for _ in range(cfg.n_layers)] if is_quantized(self.dtype) else []

    @property
    def tensors(self) -> list[Tensor]:
        """Every buffer of the cache: what a step realizes and a block copy copies."""
        return self.layers + self.scales

    def layer_scales(self, layer: int) -> Tensor | None:
        return self.scales[layer] if self.scales else None

    @property
    def scratch_slot(self) -> int:
        return self.scratch_block * self.block_size
