"""One worker's share of the model's weights (protocol/parallel_layout.py says who holds what).

Tensor parallelism (Megatron): q/k/v and gate/up are split by their output rows (whole heads, MLP units), o and
down by their input columns, so each rank's o and down outputs are partial sums that the ranks all-reduce; a mixture
of experts' FFNs likewise, every expert's (the router is replicated, so every rank routes a token alike); the
embedding and the output head are split by vocabulary rows (padded with zero rows to equal shards). Norms are
replicated. Pipeline parallelism keeps only the stage's layers (renumbered from 0), the embedding on the first
stage and the final norm and head on the last. A worker therefore loads about 1 / (tp * pp) of the weights.

Quantised GGUF blocks run along a row, so a column split of a quantised weight stays quantised when it falls on
block boundaries; otherwise that weight is dequantised to float32 first (correct, larger).
"""
import dataclasses
import logging
import re

import numpy as np

from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.protocol.parallel_layout import ShardSpec, kv_head_range
from tinyvllm.workers.quantized_weight import QuantizedArray

log = logging.getLogger(__name__)
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
_BY_ROWS = {"attn_q": "q", "attn_k": "kv", "attn_v": "kv", "ffn_gate": "ffn", "ffn_up": "ffn"}
_BY_COLUMNS = {"attn_output": "q", "ffn_down": "ffn", "ffn_down_exps": "expert_ffn"}


def take_rows(w, start: int, stop: int):
    if isinstance(w, QuantizedArray):
        return QuantizedArray(w.type_name, np.ascontiguousarray(w.blocks[start:stop]))
    return np.ascontiguousarray(np.asarray(w)[start:stop])


def take_expert_rows(w, n_experts: int, start: int, stop: int):
    """Rows start .. stop - 1 of every expert of a matrix holding n_experts experts' rows one after another."""
    if isinstance(w, QuantizedArray):
        blocks = w.blocks.reshape(n_experts, -1, *w.blocks.shape[1:])[:, start:stop]
        return QuantizedArray(w.type_name, np.ascontiguousarray(blocks.reshape(-1, *w.blocks.shape[1:])))
    w = np.asarray(w)
    return np.ascontiguousarray(w.reshape(n_experts, -1, w.shape[1])[:, start:stop].reshape(-1, w.shape[1]))


def take_columns(w, start: int, stop: int):
    if isinstance(w, QuantizedArray):
        if start % w.block_elems == 0 and stop % w.block_elems == 0:
            return QuantizedArray(w.type_name,
                                  np.ascontiguousarray(w.blocks[:, start // w.block_elems:stop // w.block_elems]))
        log.warning("a %s tensor split at columns %d:%d (not on its %d-element blocks) is widened to float32",
                    w.type_name, start, stop, w.block_elems)
        w = np.asarray(w)
    return np.ascontiguousarray(np.asarray(w)[:, start:stop])


def pad_rows(w, rows: int):
    """w with zero rows appended up to `rows` (a zero quantised block dequantises to zeros)."""
    missing = rows - w.shape[0]
    if missing == 0:
        return w
    if isinstance(w, QuantizedArray):
        zeros = np.zeros((missing, *w.blocks.shape[1:]), np.uint8)
        return QuantizedArray(w.type_name, np.concatenate([w.blocks, zeros]))
    w = np.asarray(w)
    return np.concatenate([w, np.zeros((missing, *w.shape[1:]), w.dtype)])


def vocab_shard(vocab_size: int, spec: ShardSpec) -> range:
    """The vocabulary rows rank spec.tp_rank holds: equal shards of ceil(V / tp), the last padded."""
    per_rank = -(-vocab_size // spec.tp_size)
    return range(spec.tp_rank * per_rank, (spec.tp_rank + 1) * per_rank)


def head_ranges(cfg: ModelConfig, spec: ShardSpec) -> dict[str, range]:
    """Rank spec.tp_rank's rows of each split dimension: query heads, KV heads (replicated when fewer than ranks)
    and MLP units, in elements."""
    t, r, hd = spec.tp_size, spec.tp_rank, cfg.head_dim
    q_heads = cfg.n_heads // t
    kv = kv_head_range(cfg.n_kv_heads, r, t)
    ffn, expert_ffn = cfg.ffn_dim // t, cfg.expert_ffn_dim // t
    return {"q": range(r * q_heads * hd, (r + 1) * q_heads * hd),
            "kv": range(kv.start * hd, kv.stop * hd), "ffn": range(r * ffn, (r + 1) * ffn),
            "expert_ffn": range(r * expert_ffn, (r + 1) * expert_ffn)}


def shard_weights(cfg: ModelConfig, weights: dict, spec: ShardSpec) -> tuple[ModelConfig, dict, int]:
    """(the config this worker's model sees, its weights under GGUF names with its layers numbered from 0, the
    first vocabulary id of its embedding/head shard)."""
    if spec.tp_size > 1 and any(name.startswith("blk.0.post_") for name in weights):
        raise ValueError(f"{cfg.arch}: norms of the attention and MLP outputs (Gemma) are not supported with "
                         f"--tensor-parallel-size > 1 yet (they would need the all-reduced sums)")
    assert not (cfg.n_experts and cfg.expert_ffn_dim % spec.tp_size), "protocol/parallel_layout.py checks this"
    if spec.tp_size > 1 and (cfg.attention_sinks or cfg.expert_bias):
        raise ValueError(f"{cfg.arch}: attention sinks and expert biases are not supported with "
                         f"--tensor-parallel-size > 1 yet")
    layers = spec.layers(cfg.n_layers)
    ranges = head_ranges(cfg, spec)
    vocab = vocab_shard(cfg.vocab_size, spec)
    local = {}
    for name, w in weights.items():
        if m := _LAYER_RE.fullmatch(name):
            i, part = int(m.group(1)), m.group(2)
            if i not in layers:
                continue
            kind = part.split(".")[0]
            if kind in _BY_ROWS:
                rows = ranges[_BY_ROWS[kind]]
                w = take_rows(w, rows.start, rows.stop)
            elif kind in ("ffn_gate_exps", "ffn_up_exps"):
                rows = ranges["expert_ffn"]
                w = take_expert_rows(w, cfg.n_experts, rows.start, rows.stop)
            elif kind in _BY_COLUMNS:
                cols = ranges[_BY_COLUMNS[kind]]
                w = take_columns(w, cols.start, cols.stop)
            local[f"blk.{i - layers.start}.{part}"] = w
        elif name in ("token_embd.weight", "output.weight"):
            tied_head = name == "token_embd.weight" and "output.weight" not in weights
            needed = spec.first_stage if name == "token_embd.weight" else spec.last_stage
            if needed or (tied_head and spec.last_stage):
                local[name] = pad_rows(take_rows(w, vocab.start, min(vocab.stop, cfg.vocab_size)), len(vocab))
        elif name == "output_norm.weight":
            if spec.last_stage:
                local[name] = w
        else:
            local[name] = w
    local_cfg = dataclasses.replace(cfg.layers_slice(layers), n_heads=cfg.n_heads // spec.tp_size,
                                    n_kv_heads=len(ranges["kv"]) // cfg.head_dim, ffn_dim=len(ranges["ffn"]),
                                    expert_ffn_dim=len(ranges["expert_ffn"]))
    return local_cfg, local, vocab.start
