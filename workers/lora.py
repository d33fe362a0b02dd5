"""LoRA adapters over the model, several in one batch, none merged into its weights (S-LoRA and Punica's idea).

Every adapted product gains a low-rank term: y = x W^T + scale (x A^T) B^T, A [r, in] and B [out, r] from a PEFT
folder (adapter_config.json, adapter_model.safetensors). The worker holds `slots` adapters at once; per layer and per
product (q, k, v, o, gate, up, down) all slots' A are one [slots x rank, in] matrix and all B (scaled, transposed) one
[out, slots x rank], multiplied by the model's own kernels; an adapter of a smaller rank is padded with zeros and a
product it does not adapt stays zero. A step multiplies every token by every slot's A, keeps the columns of its own
row's slot (a [T, slots x rank] mask from the row's slot, zeros for the base model) and multiplies the result by B^T:
fixed shapes for the jitted step whatever the batch's mix, at slots x rank x (in + out) extra multiply-adds per token
and product. Loading an adapter writes its slot in place, so captured steps read the new weights; the least recently
used slot that the current step does not use is the one reloaded.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
from tinygrad import Tensor, dtypes

from tinyvllm.protocol.lora_adapter import MODULES, LoRAError, module_shapes, read_lora_adapter
from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.protocol.sampling import LoRARequest
from tinyvllm.workers.quantized_weight import DeviceWeight

ATTENTION, MLP = MODULES[:3], MODULES[4:]  # the products of qkv and of the MLP (o alone in attn_out)
HOST_CACHE_BYTES = 1 << 30  # adapters read, kept in host memory beyond the resident ones up to this


class LoRAWeights:
    def __init__(self, cfg: ModelConfig, slots: int, rank: int):
        if cfg.n_experts:
            raise LoRAError("LoRA adapters over a mixture of experts are not supported yet")
        self.cfg, self.slots, self.rank = cfg, slots, rank
        width = slots * rank
        shapes = module_shapes(cfg)
        zeros = lambda rows, cols: DeviceWeight("F32", (Tensor.zeros(rows, cols, dtype=dtypes.float32)
                                                        .contiguous().realize(),))
        # A [slots x rank, in] and B transposed, [out, slots x rank]: both products are the model's own (`linear`)
        self.a = [{m: zeros(width, shapes[m][0]) for m in MODULES} for _ in range(cfg.n_layers)]
        self.bt = [{m: zeros(shapes[m][1], width) for m in MODULES} for _ in range(cfg.n_layers)]
        self.resident: OrderedDict[str, int] = OrderedDict()  # adapter key -> its slot, least recently used first
        self.host: OrderedDict[str, dict] = OrderedDict()  # adapter key -> its weights: a reload reads no file

    def read(self, adapter: LoRARequest) -> dict:
        """The adapter's weights (read_lora_adapter's), from its files the first time; LoRAError if unreadable."""
        if (weights := self.host.get(adapter.key)) is None:
            weights = self.host[adapter.key] = read_lora_adapter(adapter.path, self.cfg, self.rank)
            while len(self.host) > self.slots and self._host_bytes() > HOST_CACHE_BYTES:
                self.host.popitem(last=False)  # the least recently used: read from its files again if needed
        self.host.move_to_end(adapter.key)
        return weights

    def _host_bytes(self) -> int:
        return sum(a.nbytes + b.nbytes for weights in self.host.values() for a, b in weights.values())

    def activate(self, adapters: list[LoRARequest]) -> dict[str, int]:
        """{key: slot} of a step's adapters (at most `slots` different ones, each read first), loading those not
        resident into the least recently used slots the step does not use."""
        wanted = {a.key: a for a in adapters}
        if len(wanted) > self.slots:
            raise LoRAError(f"a step mixes {len(wanted)} adapters, more than --max-loras {self.slots}")
        for key in wanted:
            if key in self.resident:
                self.resident.move_to_end(key)
        for key, adapter in wanted.items():
            if key in self.resident:
                continue
            used = set(self.resident.values())
            free = [s for s in range(self.slots) if s not in used]
            slot = free[0] if free else self.resident.pop(next(k for k in self.resident if k not in wanted))
            self._write(slot, self.read(adapter))
            self.resident[key] = slot
        return {key: self.resident[key] for key in wanted}

    def _write(self, slot: int, adapter: dict) -> None:
        rows = slice(slot * self.rank, (slot + 1) * self.rank)
        shapes = module_shapes(self.cfg)
        written = []
        for layer in range(self.cfg.n_layers):
            for m in MODULES:
                a = np.zeros((self.rank, shapes[m][0]), np.float32)  # a smaller rank's padding stays zero
                bt = np.zeros((shapes[m][1], self.rank), np.float32)
                if (found := adapter.get((layer, m))) is not None:
                    a[:found[0].shape[0]], bt[:, :found[0].shape[0]] = found
                written += [self.a[layer][m].parts[0][rows].assign(Tensor(a)),
                            self.bt[layer][m].parts[0][:, rows].assign(Tensor(bt))]
        Tensor.realize(*written)

    @staticmethod
    def row_slots(adapters: list[LoRARequest | None], rows: int, slots: dict[str, int]) -> np.ndarray:
        """[rows] int32: each row's slot, -1 for the base model and the padding rows."""
        out = np.full(rows, -1, np.int32)
        for row, adapter in enumerate(adapters):
            if adapter is not None:
                out[row] = slots[adapter.key]
        return out

    def token_mask(self, row_slots: Tensor, token_rows: Tensor) -> Tensor:
        """[T, slots x rank]: 1 in the columns of each token's row's slot, 0 elsewhere (the base model: all 0)."""
        slot = row_slots[token_rows].unsqueeze(-1)  # [T, 1]
        columns = Tensor.arange(self.slots * self.rank, dtype=dtypes.int32) // self.rank
        return (slot == columns.unsqueeze(0)).cast(dtypes.float32)

    def args(self, layer: int, modules: tuple[str, ...]) -> list[DeviceWeight]:
        """Layer `layer`'s A and B^T of each of `modules`, in that order: what its layer function adds to its
        products (workers/model.py: each row's own slot's scale (h A^T) B^T, the mask keeping its slot's columns)."""
        return [w for m in modules for w in (self.a[layer][m], self.bt[layer][m])]
