"""benchmarks/gguf_twin.py: a twin loads like its source (same header, names, shapes, types) with finite weights."""
import importlib.util
import pathlib

import numpy as np

from tests.helpers.tiny_model import make_tiny_gguf
from tinyvllm.protocol.gguf_file import GGML_TYPE_IDS, GGUFFile
from tinyvllm.workers.gguf_dequantize import dequantize, dequantize_tensor

_spec = importlib.util.spec_from_file_location("gguf_twin", pathlib.Path(__file__).parents[2] / "benchmarks" / "gguf_twin.py")
gguf_twin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gguf_twin)


def test_twin_keeps_the_header_and_replaces_the_weights(tmp_path):
    src = make_tiny_gguf(tmp_path / "tiny.gguf", dim=64, ffn=128)
    gguf_twin.make_twin(str(src), str(tmp_path / "twin.gguf.xz"))
    assert (tmp_path / "twin.gguf.xz").stat().st_size < src.stat().st_size / 2
    gguf_twin.unpack(str(tmp_path / "twin.gguf.xz"), str(tmp_path / "twin.gguf"))
    a, b = GGUFFile(src), GGUFFile(tmp_path / "twin.gguf")
    assert a.metadata == b.metadata and a.tensor_names == b.tensor_names
    assert {"F16", "Q8_0", "F32"} <= {a.tensor_type(n) for n in a.tensor_names}
    for name in a.tensor_names:
        assert a.tensor_info(name) == b.tensor_info(name)
        w = dequantize_tensor(b, name)
        assert np.isfinite(w).all() and np.abs(w).max() < 2
        if w.size > 4096:  # a pattern, not the source's values
            assert not np.array_equal(w, dequantize_tensor(a, name))


def test_q4_1_pattern_is_valid_blocks_of_small_values():
    raw = np.frombuffer(gguf_twin.pattern("Q4_1", np.random.default_rng(0)), np.uint8)
    w = dequantize(raw, GGML_TYPE_IDS["Q4_1"], gguf_twin.PATTERN_BLOCKS * 32)
    assert np.isfinite(w).all() and 0.005 < np.abs(w).max() < 0.1


_shape_spec = importlib.util.spec_from_file_location("shape_twin", pathlib.Path(__file__).parents[2] / "benchmarks" / "shape_twin.py")
shape_twin = importlib.util.module_from_spec(_shape_spec)
_shape_spec.loader.exec_module(shape_twin)


def test_shape_twin_loads_with_the_described_shapes_and_types(tmp_path):
    from tinyvllm.workers.weights import load_weights
    tokenizer = make_tiny_gguf(tmp_path / "tiny.gguf", dim=64, ffn=128)
    shape = dict(dim=128, layers=2, heads=4, kv_heads=2, ffn=256, vocab=320, context=4096, tied=False,
                 llama3_rope=(8.0, 1.0, 4.0, 1024))
    for kind in ("F16", "Q8_0", "Q4_1"):
        out = tmp_path / f"twin-{kind}.gguf"
        shape_twin.make_shape_twin(shape, "tiny", kind, str(tokenizer), str(out))
        cfg, weights = load_weights(out)
        assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.vocab_size) == (128, 2, 4, 2, 256, 320)
        assert cfg.rope_theta == 500000.0 and cfg.rope_scaling == {"rope_type": "rope_freqs"} and not cfg.tie_embeddings
        gguf = GGUFFile(out)
        assert gguf.tensor_type("blk.1.ffn_down.weight") == kind and gguf.tensor_shape("output.weight") == (320, 128)
        assert {k: v for k, v in gguf.metadata.items() if k.startswith("tokenizer.")} == \
            {k: v for k, v in GGUFFile(tokenizer).metadata.items() if k.startswith("tokenizer.")}
        w = np.asarray(weights["blk.0.attn_k.weight"], dtype=np.float32)
        assert w.shape == (64, 128) and np.isfinite(w).all() and 0 < np.abs(w).max() < 1
        freqs = weights["rope_freqs.weight"]  # llama3 scaling: 1 for the high frequencies, the factor for the low
        assert freqs[0] == 1.0 and freqs[-1] == 8.0


def test_shape_twin_with_the_tokenizers_vocabulary_has_as_many_embedding_rows_as_tokens(tmp_path):
    """--tokenizer-vocab: llama.cpp refuses a file whose embedding rows differ from its tokenizer's tokens."""
    from tinyvllm.workers.weights import load_weights
    tokenizer = make_tiny_gguf(tmp_path / "tiny.gguf", dim=64, ffn=128)
    tokens = len(GGUFFile(tokenizer).metadata["tokenizer.ggml.tokens"])
    shape = dict(dim=128, layers=1, heads=4, kv_heads=2, ffn=256, vocab=tokens + 64, context=4096, tied=False,
                 llama3_rope=None)
    out = tmp_path / "twin.gguf"
    shape_twin.make_shape_twin(shape, "tiny", "Q8_0", str(tokenizer), str(out), tokenizer_vocab=True)
    gguf = GGUFFile(out)
    assert gguf.metadata["llama.vocab_size"] == tokens
    assert gguf.tensor_shape("token_embd.weight") == gguf.tensor_shape("output.weight") == (tokens, 128)
    assert load_weights(out)[0].vocab_size == tokens


def test_a_mixture_of_experts_twin_loads_and_runs(tmp_path, caplog):
    """Qwen3-30B-A3B's kind of shape, small, cut to 2 layers (--layers): experts as 3-d tensors (ffn_down_exps given
    Q6_K in the Q4_K_M mix's layers), a router of random values, q/k norms and a head_dim that is not dim / heads;
    --ascii-output's head has zero rows for the tokens whose bytes are not all ASCII."""
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.weights import load_weights
    from tests.workers.test_architectures import model_prompt_logprobs
    tokenizer = make_tiny_gguf(tmp_path / "tiny.gguf", dim=64, ffn=128)
    shape = dict(arch="qwen3moe", dim=256, layers=8, heads=4, kv_heads=2, head_dim=128, ffn=512, experts=8,
                 experts_used=2, expert_ffn=256, vocab=320, context=4096, tied=False, llama3_rope=None,
                 rope_theta=1000000.0)
    out = tmp_path / "twin.gguf"
    shape_twin.make_shape_twin(shape, "tiny", "Q4_K_M", str(tokenizer), str(out), layers=2, ascii_output=True)
    gguf = GGUFFile(out)
    assert gguf.tensor_shape("blk.1.ffn_down_exps.weight") == (8, 256, 256)
    assert [gguf.tensor_type(f"blk.{i}.ffn_down_exps.weight") for i in (0, 1)] == ["Q4_K", "Q6_K"]  # the last eighth
    assert gguf.tensor_type("blk.0.ffn_up_exps.weight") == "Q4_K"
    assert gguf.tensor_type("blk.0.ffn_gate_inp.weight") == "F32"
    cfg, weights = load_weights(out)
    assert "widened" not in caplog.text  # 3-d expert tensors are kept compact, and counted so
    assert (cfg.arch, cfg.n_layers, cfg.head_dim, cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_dim) == \
        ("qwen3moe", 2, 128, 8, 2, 256)
    assert weights["blk.0.ffn_gate_exps.weight"].shape == (8 * 256, 256)
    tokens = GGUFFile(tokenizer).metadata["tokenizer.ggml.tokens"][:320]  # --ascii-output: no token of non-ASCII bytes
    head, ascii_tokens = np.asarray(weights["output.weight"], np.float32), shape_twin.ascii_rows(tokens)
    assert not ascii_tokens.all() and (head[~ascii_tokens] == 0).all() and np.abs(head[ascii_tokens]).max(1).min() > 0
    logprobs, _ = model_prompt_logprobs(Transformer(cfg, weights, 512, kernels="c-int8"), list(range(1, 40)))
    assert np.isfinite(logprobs).all()
