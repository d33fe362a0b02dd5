"""LoRA adapters over the model, several in one batch, none merged into its weights (S-LoRA and Punica's idea).

Every adapted product gains a low-rank term: y = x W^T + scale (x A^T) B^T, A [r, in] and B [out, r] from a PEFT
folder (adapter_config.json, adapter_model.safetensors). The worker holds `slots` adapters at once; per layer and per
product (q, k, v, o, gate, up, down) all slots' A are one [slots x rank, in] tensor and all B (scaled) one
[slots x rank, out], an adapter of a smaller rank padded with zeros and a product it does not adapt left zero. A step
multiplies every token by every slot's A, keeps the columns of its own row's slot (a [T, slots x rank] mask from the
row's slot, zeros for the base model) and multiplies the result by B: fixed shapes for the jitted step whatever the
batch's mix, at slots x rank x (in + out) extra multiply-adds per token and product. Loading an adapter writes its
slot in place, so captured steps read the new weights; the least recently used slot that the current step does not
use is the one reloaded.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
from tinygrad import Tensor, dtypes

from tinyvllm.protocol.lora_adapter import MODULES, LoRAError, module_shapes, read_peft_adapter
from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.protocol.sampling import LoRARequest

ATTENTION, MLP = MODULES[:3], MODULES[4:]  # the products of qkv and of the MLP (o alone in attn_out)


class LoRAWeights:
    def __init__(self, cfg: ModelConfig, slots: int, rank: int):
        if cfg.n_experts:
            raise LoRAError("LoRA adapters over a mixture of experts are not supported yet")
        self.cfg, self.slots, self.rank = cfg, slots, rank
        width = slots * rank
        shapes = module_shapes(cfg)
        self.a = [{m: Tensor.zeros(width, shapes[m][0], dtype=dtypes.float32).contiguous().realize() for m in MODULES}
                  for _ in range(cfg.n_layers)]
        self.b = [{m: Tensor.zeros(width, shapes[m][1], dtype=dtypes.float32).contiguous().realize() for m in MODULES}
                  for _ in range(cfg.n_layers)]
        self.resident: OrderedDict[str, tuple[int, str]] = OrderedDict()  # name -> (slot, path), least recent first

    def activate(self, adapters: list[LoRARequest]) -> dict[str, int]:
        """{name: slot} for a step's adapters (at most `slots` different ones), loading those not resident into the
        least recently used slots the step does not use. LoRAError if one cannot be read: nothing is changed then."""
        wanted = {a.name: a for a in adapters}
        if len(wanted) > self.slots:
            raise LoRAError(f"a step mixes {len(wanted)} adapters, more than --max-loras {self.slots}")
        for name, adapter in wanted.items():
            if name in self.resident and self.resident[name][1] != adapter.path:  # reloaded from another folder
                del self.resident[name]
        missing = [a for name, a in wanted.items() if name not in self.resident]
        loaded = {a.name: read_peft_adapter(a.path, self.cfg, self.rank) for a in missing}
        for name in wanted:
            if name in self.resident:
                self.resident.move_to_end(name)
        for adapter in missing:
            used = {slot for slot, _ in self.resident.values()}
            free = [s for s in range(self.slots) if s not in used]
            if not free:
                victim = next(n for n in self.resident if n not in wanted)
                free = [self.resident.pop(victim)[0]]
            self._write(free[0], loaded[adapter.name])
            self.resident[adapter.name] = (free[0], adapter.path)
        return {name: self.resident[name][0] for name in wanted}

    def _write(self, slot: int, adapter: dict) -> None:
        rows = slice(slot * self.rank, (slot + 1) * self.rank)
        shapes = module_shapes(self.cfg)
        written = []
        for layer in range(self.cfg.n_layers):
            for m in MODULES:
                a = np.zeros((self.rank, shapes[m][0]), np.float32)
                b = np.zeros((self.rank, shapes[m][1]), np.float32)
                if (found := adapter.get((layer, m))) is not None:
                    a[:found[0].shape[0]], b[:found[0].shape[0]] = found[0], found[1].T
                written += [self.a[layer][m][rows].assign(Tensor(a)), self.b[layer][m][rows].assign(Tensor(b))]
        Tensor.realize(*written)

    def row_slots(self, adapters: list[LoRARequest | None], rows: int, slots: dict[str, int]) -> np.ndarray:
        """[rows] int32: each row's slot, -1 for the base model and the padding rows."""
        out = np.full(rows, -1, np.int32)
        for row, adapter in enumerate(adapters):
            if adapter is not None:
                out[row] = slots[adapter.name]
        return out

    def token_mask(self, row_slots: Tensor, token_rows: Tensor) -> Tensor:
        """[T, slots x rank]: 1 in the columns of each token's row's slot, 0 elsewhere (the base model: all 0)."""
        slot = row_slots[token_rows].unsqueeze(-1)  # [T, 1]
        columns = Tensor.arange(self.slots * self.rank, dtype=dtypes.int32) // self.rank
        return (slot == columns.unsqueeze(0)).cast(dtypes.float32)

    def args(self, layer: int, modules: tuple[str, ...]) -> list[Tensor]:
        """Layer `layer`'s A and B of each of `modules`, in that order: what its layer function adds to its products."""
        return [t for m in modules for t in (self.a[layer][m], self.b[layer][m])]


def lora_delta(h: Tensor, mask: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Each row's own adapter's scale (h A^T) B^T, from every slot's A and B and the row's mask."""
    return ((h @ a.T) * mask) @ b
