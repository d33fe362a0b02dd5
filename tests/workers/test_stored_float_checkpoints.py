"""Hugging Face checkpoints kept in their stored width (workers/weights.py, workers/fp8_checkpoint.py): BF16 and F16
matrices stay 16-bit on the device and float8 e4m3 ones 8-bit codes with a scale per 32-element block, widened only
inside the kernels. A tiny random Qwen3 (q/k norms, a head_dim that is not hidden/heads) saved in each width,
float8 in each of the three scale layouts the field writes, gives transformers' float32 log-probabilities over a
300-token prompt (1e-4) under both kernel sets, transformers computing with the stored values widened; the
device holds half (16-bit) or 9/32 (float8) of float32's bytes for those matrices."""
import copy
import json

import numpy as np
import pytest

from tests.workers.test_architectures import ARCHITECTURES, check_against_transformers

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# how each format scales a matrix: (quantization_config, scale tensor suffix, scale block rows and columns)
FP8_FORMATS = {
    "fp8-block": ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                   "weight_block_size": [128, 128]}, "weight_scale_inv", (128, 128)),
    "compressed-tensors-channel": ({"quant_method": "compressed-tensors", "format": "float-quantized",
                                    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                                        "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}}},
                                    "ignore": ["lm_head"]}, "weight_scale", (1, None)),
    "fbgemm-tensor": ({"quant_method": "fbgemm_fp8"}, "weight_scale", (None, None)),
}


def qwen3_with_fp8_sized_matrices():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    # hidden 256 and an MLP of 320: 128-blocks that tile the matrices, the last ones only in part
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=128, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=48, intermediate_size=320,
                                        max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6,
                                        tie_word_embeddings=True))


def stored_matrices(path):
    from tinyvllm.workers.weights import load_weights
    (path / "tokenizer.json").touch()
    _, weights = load_weights(path)
    return weights


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_checkpoint_stays_16_bit_and_equals_transformers(dtype, module_kernel_set, tmp_path):
    import torch
    from tinyvllm.workers.model import Transformer

    def save(model):
        # the reference computes with the rounded weights (its RoPE tables stay float32)
        width = getattr(torch, dtype)
        model.load_state_dict({name: w.to(width).float() for name, w in model.state_dict().items()})
        copy.deepcopy(model).to(width).save_pretrained(tmp_path)
        return tmp_path

    check_against_transformers(ARCHITECTURES["qwen3"], save, module_kernel_set)
    weights = stored_matrices(tmp_path)
    matrix = weights["blk.0.attn_q.weight"]
    assert (matrix.kind == "BF16") if dtype == "bfloat16" else (matrix.dtype == np.float16)
    assert weights["blk.0.attn_norm.weight"].dtype == np.float32
    cfg = json.loads((tmp_path / "config.json").read_text())
    from tinyvllm.protocol.model_config import ModelConfig
    model = Transformer(ModelConfig.from_hf_config(cfg), weights, 64, kernels=module_kernel_set)
    n_values = sum(int(np.prod(w.shape)) for w in weights.values())
    assert model.weight_nbytes < 2.1 * n_values  # 16 bits a value (norms aside), not float32's 32


def save_fp8(model, folder, fmt: str):
    """model's linear weights as float8 e4m3 codes with scales in format `fmt`, the rest bfloat16; model itself
    then holds the values the checkpoint stores (codes x scales), for the reference."""
    import torch
    from safetensors.torch import save_file
    quantization, suffix, (block_rows, block_cols) = FP8_FORMATS[fmt]
    tensors = {}
    for name, w in model.state_dict().items():
        if not name.endswith(tuple(f"{linear}.weight" for linear in LINEARS)):
            tensors[name] = w.to(torch.bfloat16)
            with torch.no_grad():
                w.copy_(tensors[name].float())
            continue
        rows, cols = w.shape
        br, bc = block_rows or rows, block_cols or cols
        padded = torch.zeros(-(-rows // br) * br, -(-cols // bc) * bc)
        padded[:rows, :cols] = w
        blocks = padded.reshape(padded.shape[0] // br, br, padded.shape[1] // bc, bc)
        scale = blocks.abs().amax(dim=(1, 3)) / 448.0  # float8 e4m3's largest finite value
        codes = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
        stored = (codes.float() * scale[:, None, :, None]).reshape(padded.shape)[:rows, :cols]
        with torch.no_grad():
            w.copy_(stored)
        tensors[name] = codes.reshape(padded.shape)[:rows, :cols].contiguous()
        tensors[name + "_scale_inv" if suffix == "weight_scale_inv" else name[:-len("weight")] + suffix] = \
            scale.reshape(-1) if fmt == "fbgemm-tensor" else scale  # per tensor: [1]; per channel: [N, 1]
        if fmt == "compressed-tensors-channel":
            tensors[name[:-len("weight")] + "input_scale"] = torch.ones(1)  # activation scales are dropped
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_a_float8_checkpoint_stays_8_bit_and_equals_transformers(fmt, module_kernel_set, tmp_path):
    check_against_transformers(qwen3_with_fp8_sized_matrices, lambda model: save_fp8(model, tmp_path, fmt),
                               module_kernel_set)
    from tinyvllm.workers.quantized_weight import DeviceWeight
    weights = stored_matrices(tmp_path)
    for linear in ("attn_q", "attn_output", "ffn_down"):
        matrix = DeviceWeight.from_host(weights[f"blk.1.{linear}.weight"])
        assert matrix.kind == "F8_E4M3" and matrix.nbytes * 8 == int(np.prod(matrix.shape)) * 9


def test_a_float8_checkpoint_in_another_layout_is_refused_naming_the_problem(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file
    from tinyvllm.workers.weights import load_weights

    def rewrite(scale=None, **quantization):
        if scale is not None:
            tensors["model.layers.0.self_attn.q_proj.weight_scale_inv"] = scale
        else:
            tensors.pop("model.layers.0.self_attn.q_proj.weight_scale_inv", None)
        save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((tmp_path / "config.json").read_text())
        config["quantization_config"].update(quantization)
        (tmp_path / "config.json").write_text(json.dumps(config))

    save_fp8(qwen3_with_fp8_sized_matrices(), tmp_path, "fp8-block")
    (tmp_path / "tokenizer.json").touch()
    tensors = load_file(tmp_path / "model.safetensors")
    rewrite(torch.ones(2, 16))  # q_proj is [192, 256]: 16 blocks across are not the config's 128 columns
    with pytest.raises(ValueError, match=r"q_proj.weight: scales of shape \(2, 16\) do not tile a \[192, 256\] matrix"):
        load_weights(tmp_path)
    from tinyvllm.workers.fp8_checkpoint import per_block_scales
    with pytest.raises(ValueError, match=r"^w: scale blocks of 16 columns do not hold whole 32-element blocks"):
        per_block_scales(np.ones((192, 16)), 192, 256, "w")  # groups of 16, told by the shape alone
    rewrite(None)
    with pytest.raises(ValueError, match=r"float8 tensor model.layers.0.self_attn.q_proj.weight has no scale"):
        load_weights(tmp_path)
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.ones(192, 256, dtype=torch.int8)  # W8A8 int8 codes
    rewrite(torch.ones(192, 1))
    with pytest.raises(ValueError, match=r"q_proj.weight is I8 with a scale .*only float8 e4m3 weights with scales"):
        load_weights(tmp_path)
    rewrite(None, quant_method="compressed-tensors", weight_block_size=None,
            config_groups={"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int"}}})
    with pytest.raises(ValueError, match=r"group 'group_0' has 8-bit int weights, which are not supported"):
        load_weights(tmp_path)
    rewrite(None, quant_method="awq")
    with pytest.raises(ValueError, match=r"quant_method 'awq' is not supported \(supported: fp8, compressed-tensors"):
        load_weights(tmp_path)


def test_the_scale_block_comes_from_each_formats_config():
    from tinyvllm.workers.fp8_checkpoint import per_block_scales, scale_block
    assert scale_block({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}) == (128, 128)
    group = lambda weights: {"quantization_config": {"quant_method": "compressed-tensors",
                                                     "config_groups": {"g": {"weights": weights}}}}
    assert scale_block(group({"type": "float", "num_bits": 8, "strategy": "block", "block_structure": [64, 64]})) \
        == (64, 64)
    assert scale_block(group({"type": "float", "num_bits": 8, "strategy": "group", "group_size": 32})) == (1, 32)
    assert scale_block(group({"type": "float", "num_bits": 8, "strategy": "channel"})) is None
    scales = np.arange(6, dtype=np.float32).reshape(3, 2)  # 64 x 64 blocks of a [130, 128] matrix: the last rows part
    d = per_block_scales(scales, 130, 128, "w", (64, 64))
    assert d.shape == (130, 4) and d[0, 0] == 0 and d[0, 3] == 1 and d[64, 1] == 2 and d[129, 2] == 5


def test_dtype_narrows_float_matrices_as_torch_rounds_them_and_leaves_blocks_alone():
    """--dtype bfloat16 / float16 (DeviceWeight.from_host): a float32 matrix rounded to nearest even, as torch rounds
    it; quantised blocks stay blocks; float32 widens anything."""
    import torch
    from tinyvllm.workers.quantized_weight import DeviceWeight, QuantizedArray
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    w[0, :4] = np.array([0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF], np.uint32).view(np.float32)  # ties, and not
    for dtype, kind in (("bfloat16", "BF16"), ("float16", "F16")):
        narrow = DeviceWeight.from_host(w, dtype)
        assert narrow.kind == kind and narrow.nbytes == w.size * 2
        want = torch.from_numpy(w).to(getattr(torch, dtype)).float().numpy()
        np.testing.assert_array_equal(narrow.dequantized().numpy(), want)
        assert DeviceWeight.from_host(w[0], dtype).kind == "F32"  # a norm (1-D) stays float32
    from tests.helpers.gguf_writer import random_blocks
    q8 = QuantizedArray("Q8_0", random_blocks("Q8_0", (8, 2), np.random.default_rng(1)))
    assert DeviceWeight.from_host(q8, "bfloat16").kind == "Q8_0"
    wide = DeviceWeight.from_host(q8, "float32")
    assert wide.kind == "F32" and wide.nbytes == 8 * 64 * 4
    np.testing.assert_array_equal(wide.dequantized().numpy(), np.asarray(q8))


@pytest.mark.parametrize("kind", ["F16", "BF16", "F8_E4M3"])
def test_every_finite_value_widens_exactly_in_both_kernel_sets(kind):
    """Each finite value of the 16-bit and float8 formats (subnormals included) comes out of the C
    kernels (workers/c/kernel.h, F16C or bit operations) and tinygrad's dequantisation as itself: multiplying by the
    identity picks out every weight, with nothing rounded on the way."""
    import torch
    from tinygrad import Tensor
    from tinyvllm.workers.cpu_matmul import cpu_linear
    from tinyvllm.workers.quantized_weight import DeviceWeight, Fp8Matrix, QuantizedArray
    if kind == "F8_E4M3":
        codes = np.array([c for c in range(256) if c & 0x7F != 0x7F] + [0, 0x80], np.uint8)  # no NaNs; 256 codes
        want = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy().reshape(-1, 32)
        weight = DeviceWeight.from_host(Fp8Matrix(codes.reshape(-1, 32), np.ones((len(codes) // 32, 1), np.float32)))
    else:
        exponent = (0x7C00, 10) if kind == "F16" else (0x7F80, 7)
        bits = np.array([b for b in range(1 << 16) if b & exponent[0] != exponent[0]], "<u2")  # finite ones
        bits = np.concatenate([bits, np.zeros(-len(bits) % 32, "<u2")]).reshape(-1, 32)
        if kind == "F16":
            want, weight = bits.view(np.float16).astype(np.float32), DeviceWeight.from_host(bits.view(np.float16))
        else:
            want = (bits.astype(np.uint32) << 16).view(np.float32)
            weight = DeviceWeight.from_host(QuantizedArray("BF16", bits.view(np.uint8).reshape(*bits.shape, 2)))
    assert weight.kind == kind
    np.testing.assert_array_equal(weight.dequantized().numpy(), want)  # tinygrad's kernels
    picked = cpu_linear(Tensor(np.eye(32, dtype=np.float32)), weight).numpy()  # the C kernels: [32, N] = weight.T
    np.testing.assert_array_equal(picked, want.T)  # (a zero's sign does not survive a sum of products)
