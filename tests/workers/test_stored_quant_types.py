"""GGUF types kept compact (workers/quantized_weight.py): Q2_K, Q3_K, Q4_K, Q5_K and Q6_K in kinds of their own (their
sub-block scale codes kept), Q4_0, Q5_0, IQ4_NL, IQ4_XS and Q5_1 repacked into the kernels' Q4_1, Q8_0 or Q8_16
layout: random blocks (finite scales from subnormal to large, every code) dequantise on the device to exactly what
llama.cpp's own `gguf` package computes (an independent implementation; values, so a zero's sign aside), take the
kind's bytes on the device (not float32's), and multiply under the exact C kernels, the int8-activation ones (the
Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_0 kinds; Q8_16's products stay float32 under c-int8) and tinygrad's, within
each arithmetic's bound of numpy's float64 product; a 2-layer llama with every one of these types gives transformers'
log-probabilities (its own GGUF loading)."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes

from tests.helpers.gguf_writer import F16_FIELDS
from tests.helpers.gguf_writer import random_blocks as write_random_blocks
from tinyvllm.protocol.gguf_file import GGML_TYPE_IDS, GGML_TYPES
from tinyvllm.workers.cpu_matmul import cpu_linear
from tinyvllm.workers.quantized_weight import DEVICE_KIND, DeviceWeight, QuantizedArray

COMPACT = [t for t in DEVICE_KIND if t not in ("Q4_1", "Q8_0", "BF16", "F8_E4M3")]  # (kinds of their own, tested apart)
N, K = 24, 512


def random_blocks(type_name: str, rows: int, cols: int, seed: int = 0, extremes: bool = True,
                  scale_std: float = 0.02) -> np.ndarray:
    """[rows, blocks, bytes] of valid random blocks (extremes: one float16 scale zero, one subnormal, one large)."""
    _, elems, _ = GGML_TYPES[GGML_TYPE_IDS[type_name]]
    blocks = write_random_blocks(type_name, (rows, cols // elems), np.random.default_rng(seed), scale_std)
    if extremes:
        for row, value in enumerate((0, 6e-8, -3000)):
            blocks[row, 0, F16_FIELDS[type_name][0]:][:2] = np.array([value], "<f2").view(np.uint8)
    return blocks


def blocks_bytes(type_name: str, n: int) -> int:
    _, elems, size = GGML_TYPES[GGML_TYPE_IDS[type_name]]
    return n // elems * size


def reference(type_name: str, blocks: np.ndarray) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants
    return quants.dequantize(blocks.reshape(blocks.shape[0], -1), GGMLQuantizationType[type_name])


@pytest.mark.parametrize("words", [False, True])  # True: the GPU kernels' uint32 layout
@pytest.mark.parametrize("type_name", COMPACT)
def test_compact_weight_dequantises_as_the_gguf_package_does(type_name, words):
    blocks = random_blocks(type_name, N, K)
    want = reference(type_name, blocks)
    host = QuantizedArray(type_name, blocks)
    np.testing.assert_array_equal(np.asarray(host), want)  # workers/gguf_dequantize.py agrees with gguf
    weight = DeviceWeight.from_host(host, words=words)
    gpu_kind = {"Q5_K": "Q5_K32", "Q6_K": "Q6_K32"}.get(type_name) if words else None  # regrouped per 32-block
    assert weight.kind == (gpu_kind or DEVICE_KIND[type_name]) and weight.shape == (N, K)
    np.testing.assert_array_equal(weight.dequantized().numpy(), want)
    rows = [3, 0, N - 1, 3]
    np.testing.assert_array_equal(weight.rows(Tensor(rows, dtype=dtypes.int32)).numpy(), want[rows])


@pytest.mark.parametrize("type_name", COMPACT)
def test_the_device_holds_the_kinds_bytes_not_float32(type_name):
    weight = DeviceWeight.from_host(QuantizedArray(type_name, random_blocks(type_name, N, K)))
    n = N * K
    scale_bytes = 4 if type_name == "IQ4_XS" else 2  # float16 scales, as the file's (IQ4_XS's products: float32)
    assert weight.nbytes == {"Q4_0": n // 2 + n // 32 * 2, "Q4_1": n // 2 + n // 32 * 4,
                             "Q8_0": n + n // 32 * scale_bytes, "Q8_16": n + n // 16 * 8,
                             "Q4_K": n // 2 + n // 32 * 2 + n // 256 * 8, "Q5_K": n // 2 + n // 8 + n // 32 * 2 + n // 256 * 8,
                             "Q6_K": n // 2 + n // 4 + n // 16 + n // 256 * 4,
                             "Q3_K": n // 4 + n // 8 + n // 16 + n // 256 * 4,
                             "Q2_K": n // 4 + n // 16 + n // 256 * 8}[weight.kind]
    assert weight.nbytes <= n * 12 // 8  # at most 12 bits a value, where float32 takes 32
    if type_name == "Q4_0":  # the file's bytes, no more (Q4_1, Q8_0: test_quantized_weight.py)
        assert weight.nbytes == blocks_bytes(type_name, n)
    if type_name in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"):  # within 1.06x of the file's bits: 2.75 for 2.625,
        # 3.625 for 3.4375, 4.75 for 4.5, 5.75 for 5.5, 6.625 for 6.5625
        assert weight.nbytes <= 1.06 * blocks_bytes(type_name, n)


def test_gguf_files_name_every_type_and_tensors_too_short_for_a_block_stay_float():
    assert all(QuantizedArray.keeps(t, (8, 256)) for t in DEVICE_KIND)
    assert not QuantizedArray.keeps("Q4_K", (8, 160)) and QuantizedArray.keeps("Q4_0", (8, 160))
    assert QuantizedArray.keeps("Q3_K", (8, 256)) and QuantizedArray.keeps("Q2_K", (8, 256))
    assert not QuantizedArray.keeps("IQ3_XXS", (8, 256)) and not QuantizedArray.keeps("IQ2_XS", (8, 256))
    assert GGML_TYPES[GGML_TYPE_IDS["IQ4_XS"]] == ("IQ4_XS", 256, 136)


@pytest.mark.parametrize("type_name", COMPACT)
@pytest.mark.parametrize("arithmetic", ["c", "c-int8", "tinygrad"])
@pytest.mark.parametrize("rows", [1, 6])  # a matvec, and the register-tiled product
def test_products_on_compact_weights(type_name, arithmetic, rows):
    blocks = random_blocks(type_name, N, K, seed=1, extremes=False)
    weight = DeviceWeight.from_host(QuantizedArray(type_name, blocks))
    dense = reference(type_name, blocks).astype(np.float64)
    h = np.random.default_rng(rows).standard_normal((rows, K)).astype(np.float32)
    want = h.astype(np.float64) @ dense.T
    if arithmetic == "tinygrad":
        got = (Tensor(h) @ weight.dequantized().T).numpy()
    else:
        got = cpu_linear(Tensor(h), weight, int8_activations=arithmetic == "c-int8").numpy()
    bound = 1e-5 * np.abs(want).max()  # float32 sums
    if arithmetic == "c-int8":  # each activation within half a step (its block's max |h| / 127, halved) of h
        step = np.repeat(np.abs(h).reshape(rows, -1, 32).max(-1) / 254, 32, axis=1)
        bound = bound + step @ np.abs(dense).T
    assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()


# ---- a model in these types, against transformers' own GGUF loading --------------------------------------------

VOCAB, DIM, FFN = 512, 256, 512
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
LAYER_TYPES = [dict(zip(MATRICES, COMPACT[:7])), dict(zip(MATRICES, (COMPACT[7:] + COMPACT)[:7]))]
SCALE_STD = {"Q4_0": 0.01, "Q5_0": 0.004, "IQ4_NL": 6e-4, "IQ4_XS": 2e-5, "Q4_K": 1e-4, "Q5_1": 0.003,
             "Q5_K": 5e-5, "Q6_K": 2e-5, "Q2_K": 2e-3, "Q3_K": 4e-4}  # weights of std ~0.05


@pytest.fixture(scope="module")
def mixed_type_llama(tmp_path_factory):
    """(path, prompt, transformers' log-probabilities): a tied 2-layer llama GGUF whose every matrix is random
    blocks of one of the repacked types (the embedding Q4_K), loaded and run by transformers (float32)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    from tests.helpers.gguf_writer import Blocks, write_gguf
    from tests.helpers.hf_to_gguf import gguf_metadata
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=FFN, max_position_embeddings=512, rms_norm_eps=1e-5,
                         tie_word_embeddings=True)
    shapes = {"attn_q": (DIM, DIM), "attn_k": (DIM // 2, DIM), "attn_v": (DIM // 2, DIM),
              "attn_output": (DIM, DIM), "ffn_gate": (FFN, DIM), "ffn_up": (FFN, DIM), "ffn_down": (DIM, FFN)}

    def blocks(type_name, shape, seed):
        return Blocks(random_blocks(type_name, *shape, seed=seed, extremes=False, scale_std=SCALE_STD[type_name]),
                      type_name), type_name

    tensors = {"token_embd.weight": blocks("Q4_K", (VOCAB, DIM), 0), "output_norm.weight": (np.ones(DIM), "F32")}
    for i in range(2):
        for j, (name, shape) in enumerate(shapes.items()):
            tensors[f"blk.{i}.{name}.weight"] = blocks(LAYER_TYPES[i][name], shape, 10 * i + j + 1)
        for norm in ("attn_norm", "ffn_norm"):
            tensors[f"blk.{i}.{norm}.weight"] = (np.ones(DIM), "F32")
    folder = tmp_path_factory.mktemp("mixed")
    path = write_gguf(folder / "m.gguf", gguf_metadata(config, "llama"), tensors)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=path.name, dtype=torch.float32).eval()
    prompt = np.random.default_rng(1).integers(0, VOCAB, 40).tolist()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), -1).numpy()
    return path, prompt, logprobs


def compare(mixed_type_llama, kernels: str, bound: float) -> None:
    from tests.workers.test_architectures import tinyvllm_prompt_logprobs
    from tinyvllm.workers.weights import load_weights
    path, prompt, expected = mixed_type_llama
    _, weights = load_weights(path)
    kept = {weights[f"blk.{i}.{name}.weight"].type_name for i in range(2) for name in MATRICES}
    assert kept == set(COMPACT)  # none widened
    got, sampled = tinyvllm_prompt_logprobs(path, prompt, kernels)
    np.testing.assert_allclose(got, expected[np.arange(len(prompt) - 1), prompt[1:]], rtol=0, atol=bound)
    assert sampled == int(expected[-1].argmax())


def test_a_model_of_compact_types_equals_transformers(mixed_type_llama, kernel_set):
    compare(mixed_type_llama, kernel_set, 1e-4)


def test_a_model_of_compact_types_with_int8_activations_stays_near_transformers(mixed_type_llama, c_kernel_set):
    compare(mixed_type_llama, "c-int8", 0.1)  # measured 0.025


def test_bf16_is_kept_and_a_tensor_still_widened_is_named_and_refused_where_its_float32_would_not_fit(
        tmp_path, monkeypatch, caplog):
    """A GGUF BF16 matrix stays BF16 (16 bits a value on the device); a quantised tensor the kernels cannot read as
    stored (here a 1-D Q8_0 norm) is widened, named in a warning, and refused when its float32 copy would not fit."""
    from transformers import LlamaConfig
    from tests.helpers.gguf_writer import Blocks, write_gguf
    from tests.helpers.hf_to_gguf import gguf_metadata
    from tinyvllm.workers import weights
    config = LlamaConfig(vocab_size=64, hidden_size=256, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=256, tie_word_embeddings=True)
    bf16 = (np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32).view(np.uint32) >> 16)
    tensors = {"token_embd.weight": (Blocks(bf16.astype("<u2").view(np.uint8).reshape(64, 256, 2), "BF16"), "BF16"),
               "output_norm.weight": (np.ones(256), "Q8_0")}
    for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        tensors[f"blk.0.{name}.weight"] = (np.zeros((256, 256)), "F32")
    for name in ("attn_norm", "ffn_norm"):
        tensors[f"blk.0.{name}.weight"] = (np.ones(256), "F32")
    path = write_gguf(tmp_path / "bf16.gguf", gguf_metadata(config, "llama"), tensors)
    with caplog.at_level("WARNING"):
        _, loaded = weights.load_weights(path)
    assert "type Q8_0 are widened to float32" in caplog.text
    embedding = loaded["token_embd.weight"]
    assert isinstance(embedding, QuantizedArray) and embedding.kind == "BF16" and embedding.shape == (64, 256)
    np.testing.assert_array_equal(np.asarray(embedding), (bf16 << 16).view(np.float32))
    device = DeviceWeight.from_host(embedding)
    assert device.kind == "BF16" and device.nbytes == 64 * 256 * 2
    np.testing.assert_array_equal(device.dequantized().numpy(), (bf16 << 16).view(np.float32))
    assert loaded["output_norm.weight"].dtype == np.float32 and loaded["output_norm.weight"].shape == (256,)
    monkeypatch.setattr(weights, "available_memory_bytes", lambda: 500)  # the norm as float32: 1 kB
    monkeypatch.setattr(weights, "dequantize_tensor", lambda *a: pytest.fail("widened before the check"))
    with pytest.raises(ValueError, match=r"Q8_0 tensors are not kept compact .* more than the 0.0 GB available"):
        weights.load_weights(path)


def test_a_type_not_read_at_all_is_refused_naming_it(tmp_path):
    from tests.helpers.gguf_writer import Blocks, write_gguf
    from tinyvllm.protocol.gguf_file import GGUFFile
    from tinyvllm.workers.gguf_dequantize import dequantize_tensor
    iq3 = Blocks(np.random.default_rng(0).integers(0, 256, (4, 1, 98), dtype=np.uint8), "IQ3_XXS")
    gguf = GGUFFile(write_gguf(tmp_path / "iq3.gguf", {"general.architecture": "test"}, {"w": (iq3, "IQ3_XXS")}))
    with pytest.raises(ValueError, match="GGUF tensor type IQ3_XXS is not supported .*Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"):
        dequantize_tensor(gguf, "w")
