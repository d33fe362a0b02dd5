"""Weights kept quantised on the device: the in-kernel dequantisation gives exactly gguf_dequantize.py's float32
values, load_weights keeps Q4_1/Q8_0 matrices as blocks (rope rows un-permuted too), and a Transformer on
quantised weights computes what the float32 one does, with either kernel set (tests/workers/conftest.py): the C
kernels, or tinygrad's on both the fused (few rows) and the scratch-buffer (many rows) matmul paths. F16 matrices
stay float16 (widened inside the kernels of either set)."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from tests.helpers.gguf_writer import write_gguf
from tests.workers.dense_reference import dense_logits
from tests.workers.test_model_config import DIMS, llama_cpp_permute, random_hf_weights
from tinyvllm.protocol.gguf_file import GGUFFile
from tinyvllm.workers.gguf_dequantize import dequantize_tensor
from tinyvllm.workers import kernel_set as kernel_set_module
from tinyvllm.workers import model as model_module
from tinyvllm.workers.gpu_matvec import gpu_matvec
from tinyvllm.workers.model import FUSED_DEQUANT_MAX_ROWS, Transformer
from tinyvllm.workers.quantized_weight import WORDS_PER_BLOCK, DeviceWeight, QuantizedArray
from tinyvllm.workers.weights import hf_to_gguf_name, load_weights

IN_KERNEL = ("Q4_1", "Q8_0")


def awkward_matrix(rng, rows: int, cols: int) -> np.ndarray:
    """Random rows plus the blocks that stress a quantiser: all zero, constant, tiny, huge, one outlier."""
    x = (rng.standard_normal((rows, cols)) * 2).astype(np.float32)
    x[0] = 0
    x[1, :32] = 5.0
    x[2, :32] = np.linspace(-1, 1, 32)
    x[3] *= 1e-4
    x[4] *= 300
    x[5, 7] = 40.0
    return x


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    x = awkward_matrix(np.random.default_rng(0), 48, 160)
    path = tmp_path_factory.mktemp("q") / "q.gguf"
    return GGUFFile(write_gguf(path, {"general.architecture": "test"}, {t: (x, t) for t in IN_KERNEL}))


@pytest.mark.parametrize("words", [False, True])  # True: the GPU kernels' uint32 layout
@pytest.mark.parametrize("type_name", IN_KERNEL + ("F16",))
def test_device_dequantisation_equals_numpy_exactly(gguf, type_name, words):
    if type_name == "F16":
        host = reference = awkward_matrix(np.random.default_rng(1), 48, 160).astype(np.float16)
    else:
        reference = dequantize_tensor(gguf, type_name)  # the numpy dequantisation
        host = QuantizedArray.from_raw(gguf.tensor_type(type_name), gguf.raw(type_name), gguf.tensor_shape(type_name))
        assert host.shape == reference.shape == (48, 160) and host.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(host), reference)
    weight = DeviceWeight.from_host(host, words=words)
    # a GPU holds Q6_K regrouped per 32-block (Q6_K32)
    assert weight.kind == ("Q6_K32" if words and type_name == "Q6_K" else type_name) and weight.shape == (48, 160)
    assert (weight.parts[0].dtype == dtypes.uint32) == (words and type_name in WORDS_PER_BLOCK)
    got = weight.dequantized().numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, reference)
    rows = [5, 0, 47, 5, 2]
    np.testing.assert_array_equal(weight.rows(Tensor(rows, dtype=dtypes.int32)).numpy(), reference[rows])


def test_f16_rows_of_partial_blocks_stay_half_not_words():
    weight = DeviceWeight.from_host(np.ones((4, 48), np.float16), words=True)  # the GPU kernels take whole blocks
    assert weight.parts[0].dtype == dtypes.half and weight.shape == (4, 48)
    np.testing.assert_array_equal(weight.dequantized().numpy(), np.ones((4, 48), np.float32))


def test_device_bytes_per_weight(gguf):
    n = 48 * 160
    host = {t: QuantizedArray.from_raw(t, gguf.raw(t), gguf.tensor_shape(t)) for t in IN_KERNEL}
    q4_1, q8_0 = (DeviceWeight.from_host(host[t]) for t in IN_KERNEL)
    assert q4_1.nbytes == n // 2 + n // 32 * 4  # nibbles + float16 d and m per 32-block, as in the file
    assert q8_0.nbytes == n + n // 32 * 2
    as_f32 = DeviceWeight.from_host(host["Q4_1"], "float32")
    assert as_f32.kind == "F32" and as_f32.nbytes == n * 4


def test_only_whole_block_matrices_of_in_kernel_types_stay_quantised():
    assert QuantizedArray.keeps("Q4_1", (8, 64)) and QuantizedArray.keeps("Q8_0", (8, 64))
    assert not QuantizedArray.keeps("Q4_1", (64,)) and not QuantizedArray.keeps("F16", (8, 64))
    assert not QuantizedArray.keeps("IQ3_XXS", (8, 256))  # (the repacked types: test_stored_quant_types.py)
    with pytest.raises(ValueError, match="IQ3_XXS is not kept quantised"):
        QuantizedArray("IQ3_XXS", np.zeros((1, 1, 98), np.uint8))


def write_quantised_llama(path, rng) -> None:
    """A tied llama GGUF: attention Q4_1 but v F16, feed-forward and embedding Q8_0, norms F32 (q/k rows
    llama.cpp-permuted)."""
    hf = random_hf_weights(rng, "llama", tied=True)
    md = {"general.architecture": "llama", "llama.vocab_size": DIMS["vocab"], "llama.embedding_length": DIMS["dim"],
          "llama.block_count": DIMS["layers"], "llama.attention.head_count": DIMS["heads"],
          "llama.attention.head_count_kv": DIMS["kv_heads"], "llama.feed_forward_length": DIMS["ffn"],
          "llama.rope.freq_base": 10000.0, "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.context_length": 512}
    tensors = {}
    for name, w in hf.items():
        if ".q_proj." in name or ".k_proj." in name:
            w = llama_cpp_permute(w, DIMS["heads"] if ".q_proj." in name else DIMS["kv_heads"])
        gguf_name = hf_to_gguf_name(name)
        kind = "F32" if w.ndim == 1 else "F16" if ".attn_v." in gguf_name else "Q4_1" if ".attn_" in gguf_name else "Q8_0"
        tensors[gguf_name] = ((w * 0.3).astype(np.float32), kind)
    write_gguf(path, md, tensors)


@pytest.fixture(scope="module")
def quantised_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "m.gguf"
    write_quantised_llama(path, np.random.default_rng(1))
    return load_weights(path), load_weights(path, keep_quantized=False)


def test_load_weights_keeps_blocks_and_unpermutes_their_rows(quantised_llama):
    (cfg, kept), (cfg_f32, f32) = quantised_llama
    assert cfg == cfg_f32 and kept.keys() == f32.keys()
    assert isinstance(kept["blk.0.attn_q.weight"], QuantizedArray) and kept["blk.0.attn_q.weight"].type_name == "Q4_1"
    assert isinstance(kept["token_embd.weight"], QuantizedArray) and kept["token_embd.weight"].type_name == "Q8_0"
    assert type(kept["blk.0.attn_norm.weight"]) is np.ndarray
    assert kept["blk.0.attn_v.weight"].dtype == np.float16 and f32["blk.0.attn_v.weight"].dtype == np.float32
    assert all(type(w) is np.ndarray for w in f32.values())
    for name in kept:  # the rope un-permutation of q/k rows moves whole rows of blocks
        np.testing.assert_array_equal(np.asarray(kept[name]), f32[name], err_msg=name)


def dense_attention(cfg):
    """attend() for Transformer.forward over one whole causal sequence, without a cache."""
    def attend(_layer, q, kv):
        T, rep = q.shape[0], cfg.n_heads // cfg.n_kv_heads
        k, v = (kv[:, i].repeat_interleave(rep, dim=1).permute(1, 0, 2) for i in (0, 1))
        mask = Tensor.ones(T, T, dtype=dtypes.bool).tril()
        out = q.permute(1, 0, 2).scaled_dot_product_attention(k, v, attn_mask=mask)
        return out.permute(1, 0, 2).reshape(T, cfg.n_heads * cfg.head_dim)
    return attend


@pytest.mark.parametrize("n_tokens", [1, FUSED_DEQUANT_MAX_ROWS + 3])  # fused dequant / scratch float32 weight
def test_quantised_transformer_equals_float32_one(quantised_llama, n_tokens, kernel_set):
    (cfg, kept), (_, f32) = quantised_llama
    quantised = Transformer(cfg, kept, 64, kernels=kernel_set)
    plain = Transformer(cfg, kept, 64, kernels=kernel_set, dtype="float32")
    wq, _, f16 = quantised.layers[1].qkv  # separate products on the CPU; v float16, widened inside the kernels
    assert quantised.tok_embeddings.kind == "Q8_0" and wq.kind == "Q4_1"
    assert quantised.output is quantised.tok_embeddings and plain.tok_embeddings.kind == "F32"
    assert (f16.kind, f16.nbytes) == ("F16", cfg.n_kv_heads * cfg.head_dim * cfg.dim * 2)
    assert quantised.weight_nbytes * 3 < plain.weight_nbytes
    tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, n_tokens).tolist()
    outs = []
    for model in (quantised, plain):
        t = Tensor(tokens, dtype=dtypes.int32)
        hidden = model.forward(t, Tensor.arange(n_tokens, dtype=dtypes.int32), dense_attention(cfg))
        outs.append(model.logits(hidden).numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=2e-5 * np.abs(outs[1]).max())
    np.testing.assert_allclose(outs[0], dense_logits(cfg, f32, tokens), rtol=0, atol=1e-4 * np.abs(outs[1]).max())


@pytest.mark.parametrize("n_tokens", [1, FUSED_DEQUANT_MAX_ROWS + 3])  # the GPU matvec / scratch weight from words
def test_gpu_kernel_path_equals_float32_one(quantised_llama, n_tokens, monkeypatch):
    """The path a GPU takes (words layout, workers/gpu_matvec.py's kernels inside the layer functions), on the
    CPU: its kernels without the GPU layout, which needs local memory."""
    (cfg, kept), _ = quantised_llama
    monkeypatch.setattr(kernel_set_module, "gpu_matvec_device", lambda device: True)
    monkeypatch.setattr(model_module, "gpu_matvec", lambda h, w, layout, rows_in: gpu_matvec(h, w, None, rows_in))
    gpu_path = Transformer(cfg, kept, 64, kernels="tinygrad")
    # q and k joined into one product (both Q4_1), v (float16 in words) its own
    wqk, wv = gpu_path.layers[1].qkv
    assert gpu_path.kernels.gpu_matvec and wv.parts[0].dtype == dtypes.uint32
    assert (wqk.kind, wqk.shape[0]) == ("Q4_1", (cfg.n_heads + cfg.n_kv_heads) * cfg.head_dim)
    assert len(gpu_path.layers[1].gate_up) == 1 and gpu_path.layers[1].gate_up[0].shape[0] == 2 * cfg.ffn_dim
    plain = Transformer(cfg, kept, 64, kernels="tinygrad", dtype="float32")
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, n_tokens).tolist()
    outs = []
    for model in (gpu_path, plain):
        hidden = model.forward(Tensor(tokens, dtype=dtypes.int32), Tensor.arange(n_tokens, dtype=dtypes.int32),
                               dense_attention(cfg))
        outs.append(model.logits(hidden).numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=2e-5 * np.abs(outs[1]).max())
