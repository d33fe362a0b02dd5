"""Each worker's share of the weights (workers/tensor_parallel.py) and which sizes a model splits into
(protocol/parallel_layout.py), checked against the whole model's weights."""
import dataclasses

import numpy as np
import pytest

from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.protocol.parallel_layout import ShardSpec, check_parallel_sizes, output_rank, stage_layers
from tinyvllm.workers.quantized_weight import QuantizedArray
from tinyvllm.workers.tensor_parallel import shard_weights

CFG = ModelConfig(arch="llama", vocab_size=10, dim=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=64,
                  rope_theta=10000.0, rms_eps=1e-5, max_context=64, tie_embeddings=True)


def q8_0(rows: int, cols: int, rng) -> QuantizedArray:
    blocks = rng.integers(0, 256, (rows, cols // 32, 34), dtype=np.uint8)
    blocks[:, :, 1] = 0x3C  # a float16 scale of about 1, never NaN
    return QuantizedArray("Q8_0", blocks)


def full_weights(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    hd, c = CFG.head_dim, CFG
    w = {"token_embd.weight": rng.standard_normal((c.vocab_size, c.dim)).astype(np.float32),
         "output_norm.weight": rng.standard_normal(c.dim).astype(np.float32)}
    for i in range(c.n_layers):
        p = f"blk.{i}."
        w |= {p + "attn_norm.weight": rng.standard_normal(c.dim).astype(np.float32),
              p + "ffn_norm.weight": rng.standard_normal(c.dim).astype(np.float32),
              p + "attn_q.weight": rng.standard_normal((c.n_heads * hd, c.dim)).astype(np.float32),
              p + "attn_k.weight": rng.standard_normal((c.n_kv_heads * hd, c.dim)).astype(np.float32),
              p + "attn_v.weight": rng.standard_normal((c.n_kv_heads * hd, c.dim)).astype(np.float32),
              p + "attn_output.weight": q8_0(c.dim, c.n_heads * hd, rng),
              p + "ffn_gate.weight": q8_0(c.ffn_dim, c.dim, rng), p + "ffn_up.weight": q8_0(c.ffn_dim, c.dim, rng),
              p + "ffn_down.weight": q8_0(c.dim, c.ffn_dim, rng)}
    return w


def nbytes(w) -> int:
    return w.blocks.nbytes if isinstance(w, QuantizedArray) else np.asarray(w).nbytes


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_shards_put_back_together_are_the_model(tp):
    """q/k/v and gate/up by rows (whole heads; KV heads replicated when fewer than ranks), o and down by columns,
    the vocabulary by rows padded to equal shards."""
    full = full_weights()
    shards = [shard_weights(CFG, full, ShardSpec(r, tp)) for r in range(tp)]
    kv_per_rank = max(1, CFG.n_kv_heads // tp)
    for r, (cfg, w, vocab_start) in enumerate(shards):
        assert (cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim) == (CFG.n_heads // tp, kv_per_rank, CFG.ffn_dim // tp)
        assert vocab_start == r * -(-CFG.vocab_size // tp)
        # each rank's query heads read the KV head they belong to (GQA groups of n_heads / n_kv_heads)
        first_q_head = r * cfg.n_heads
        kv_head = first_q_head // (CFG.n_heads // CFG.n_kv_heads)
        np.testing.assert_array_equal(w["blk.1.attn_k.weight"][:CFG.head_dim],
                                      full["blk.1.attn_k.weight"][kv_head * CFG.head_dim:(kv_head + 1) * CFG.head_dim])
    for name, axis in (("blk.2.attn_q.weight", 0), ("blk.2.ffn_up.weight", 0), ("blk.2.attn_output.weight", 1),
                       ("blk.2.ffn_down.weight", 1), ("token_embd.weight", 0)):
        joined = np.concatenate([np.asarray(w[name]) for _, w, _ in shards], axis=axis)
        np.testing.assert_array_equal(joined[:CFG.vocab_size] if name == "token_embd.weight" else joined,
                                      np.asarray(full[name]), err_msg=name)
    padded = np.concatenate([w["token_embd.weight"] for _, w, _ in shards])
    assert padded.shape[0] % tp == 0 and not padded[CFG.vocab_size:].any()  # zero rows: never a real token's
    # a column split on block boundaries stays quantised; one through blocks (16 of 32 columns) is dequantised
    assert isinstance(shards[0][1]["blk.0.ffn_down.weight"], QuantizedArray if tp == 2 else np.ndarray)
    np.testing.assert_array_equal(shards[1][1]["output_norm.weight"], full["output_norm.weight"])


def test_a_worker_holds_its_share_of_the_bytes():
    full = full_weights()
    whole = sum(nbytes(w) for w in full.values())
    norms = sum(nbytes(w) for n, w in full.items() if "norm" in n)  # replicated on every rank
    for r in range(2):
        share = sum(nbytes(w) for w in shard_weights(CFG, full, ShardSpec(r, 2))[1].values())
        assert share <= (whole - norms) / 2 + norms + nbytes(full["token_embd.weight"]) / 10  # + a padding row


def test_pipeline_stages_keep_their_layers_renumbered():
    full = full_weights()
    first = shard_weights(CFG, full, ShardSpec(0, 1, 0, 2))
    last = shard_weights(CFG, full, ShardSpec(0, 1, 1, 2))
    assert [first[0].n_layers, last[0].n_layers] == [1, 2]  # the remainder goes to the last stage
    np.testing.assert_array_equal(last[1]["blk.0.attn_q.weight"], full["blk.1.attn_q.weight"])
    assert "blk.2.attn_q.weight" not in last[1] and "output_norm.weight" not in first[1]
    assert "token_embd.weight" in first[1] and "token_embd.weight" in last[1]  # tied: the last stage's head


def test_sizes_that_do_not_split_are_refused_naming_those_that_do():
    smollm2 = dataclasses.replace(CFG, n_heads=9, n_kv_heads=3, ffn_dim=1536, n_layers=30)
    with pytest.raises(ValueError, match=r"--tensor-parallel-size 2 does not split.*9 attention heads.*sizes that work: 1, 3\)"):
        check_parallel_sizes(smollm2, 2, 1)
    check_parallel_sizes(smollm2, 3, 2)
    with pytest.raises(ValueError, match="between 1 and the model's 30 layers"):
        check_parallel_sizes(smollm2, 1, 31)
    assert [stage_layers(30, s, 4) for s in range(4)] == [range(0, 7), range(7, 14), range(14, 21), range(21, 30)]
    assert output_rank(3, 2) == 3 and ShardSpec.of_rank(3, 3, 2) == ShardSpec(0, 3, 1, 2)
