"""Architectures beyond Llama, each a tiny random-weight model made and saved by transformers: tinyvllm
loads the folder and its prompt log-probabilities over a prompt equal transformers' float32 ones, under both kernel
sets. The prompt is longer than every sliding window and soft-capped scores and logits exceed their caps.
Qwen2: biases on q, k and v (drawn, as transformers starts them at zero); Llama with attention_bias: on o as well.
Qwen3: an RMSNorm over each head's queries and keys before RoPE, and a head_dim that is not hidden/heads.
Mistral: Llama's layers with a sliding window. Phi-3: fused qkv and gate_up projections, split at load.
Gemma 2: alternating local (windowed) and global layers, soft-capped attention scores and logits, the embedding
scale, GeGLU, norms of the attention and MLP outputs, queries scaled by query_pre_attn_scalar. Gemma 3: Gemma 2
without the caps, with q/k norms, local layers on a RoPE base of their own and global ones with linear scaling."""
import copy
import pathlib

import numpy as np
import pytest

VOCAB = 128
CONTEXT, PROMPT, WINDOW = 512, 300, 37  # a window that is no multiple of the block size (4)


def qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=24, intermediate_size=96,
                                        max_position_embeddings=CONTEXT, rope_theta=10000.0, rms_norm_eps=1e-6,
                                        tie_word_embeddings=True))


def qwen2():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=96, max_position_embeddings=CONTEXT,
                                         rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True))
    with torch.no_grad():  # biases of the size that matters (transformers starts them at zero)
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def llama_with_biases():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=96, max_position_embeddings=CONTEXT,
                                         rope_theta=10000.0, rms_norm_eps=1e-6, attention_bias=True))
    with torch.no_grad():  # q, k, v and o biases of the size that matters (transformers starts them at zero)
        for layer in model.model.layers:
            attention = layer.self_attn
            for proj in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj):
                proj.bias.normal_(0, 0.5)
    return model


def mistral():
    from transformers import MistralConfig, MistralForCausalLM
    return MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                                            max_position_embeddings=CONTEXT, rope_theta=10000.0, rms_norm_eps=1e-5,
                                            sliding_window=WINDOW))


def phi3():
    from transformers import Phi3Config, Phi3ForCausalLM
    return Phi3ForCausalLM(Phi3Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=CONTEXT,
                                      original_max_position_embeddings=CONTEXT, rope_theta=10000.0, rms_norm_eps=1e-5,
                                      sliding_window=None, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      tie_word_embeddings=False))


def gemma2(query_scalar=24):
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM
    model = Gemma2ForCausalLM(Gemma2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=16, intermediate_size=96,
                                          max_position_embeddings=CONTEXT, sliding_window=WINDOW,
                                          query_pre_attn_scalar=query_scalar, attn_logit_softcapping=0.5,
                                          final_logit_softcapping=0.3, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    model.set_attn_implementation("eager")  # sdpa ignores the soft cap
    with torch.no_grad():  # scores well past the cap
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight *= 8
            layer.self_attn.k_proj.weight *= 8
    return model


def gemma3(query_scalar=24, layer_types=("sliding_attention", "full_attention", "sliding_attention")):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}
    return Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=len(layer_types), num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=CONTEXT,
        sliding_window=WINDOW, query_pre_attn_scalar=query_scalar, rope_parameters=rope, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, layer_types=list(layer_types)))


ARCHITECTURES = {"qwen2": qwen2, "qwen3": qwen3, "llama-with-biases": llama_with_biases, "mistral": mistral,
                 "phi3": phi3, "gemma2": gemma2, "gemma3": gemma3}
# As llama.cpp reads a GGUF: Gemma's queries scaled by the head size, Gemma 3 with a global layer every sixth
GGUF_ARCHITECTURES = {"qwen3": qwen3, "phi3": phi3, "gemma2": lambda: gemma2(query_scalar=16),
                      "gemma3": lambda: gemma3(16, ["sliding_attention"] * 5 + ["full_attention"])}


def tinyvllm_prompt_logprobs(path: pathlib.Path, prompt: list[int], kernels: str) -> tuple[np.ndarray, int]:
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.weights import load_weights
    if path.is_dir():
        (path / "tokenizer.json").touch()  # a model folder has one; the weights do not need it
    cfg, weights = load_weights(path)
    return model_prompt_logprobs(Transformer(cfg, weights, CONTEXT, kernels=kernels), prompt)


def model_prompt_logprobs(model, prompt: list[int]) -> tuple[np.ndarray, int]:
    """(the prompt's log-probabilities, the greedy next token) from one prefill of `model` (a Transformer)."""
    from tinyvllm.protocol.messages import NewRequestData, StepPlan
    from tinyvllm.protocol.sampling import SamplingParams
    from tinyvllm.workers.kv_cache import PagedKVCache
    from tinyvllm.workers.model_runner import ModelRunner
    runner = ModelRunner(model, PagedKVCache(model.cfg, CONTEXT // 4, 4),
                         max_num_seqs=1, max_model_len=CONTEXT, max_num_batched_tokens=CONTEXT)
    sp = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    result = runner.execute(StepPlan(1, [NewRequestData("p", prompt, sp, list(range(-(-len(prompt) // 4))), 0,
                                                        len(prompt))], [], []))
    return np.array([entry.logprob for entry in result.prompt_logprobs[0]]), result.sampled_token_ids[0]


def transformers_logprobs(model, prompt: list[int]) -> np.ndarray:
    import torch
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), -1).numpy()


def check_against_transformers(factory, save, kernels: str) -> None:
    import torch
    torch.manual_seed(0)
    model = factory().float().eval()
    path = save(model)
    prompt = np.random.default_rng(1).integers(0, VOCAB, PROMPT).tolist()
    expected = transformers_logprobs(model, prompt)
    got, sampled = tinyvllm_prompt_logprobs(path, prompt, kernels)
    np.testing.assert_allclose(got, expected[np.arange(len(prompt) - 1), prompt[1:]], rtol=1e-4, atol=1e-4)
    assert sampled == int(expected[-1].argmax())


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_prompt_logprobs_equal_transformers(arch, module_kernel_set, tmp_path):
    check_against_transformers(ARCHITECTURES[arch], lambda model: model.save_pretrained(tmp_path) or tmp_path,
                               module_kernel_set)


def test_sharded_bfloat16_checkpoint_loads_exactly(tmp_path):
    """A bfloat16 checkpoint in several safetensors shards (with its index) loads to the same float32 values as
    transformers computes with: the comparison holds at the same tolerance."""
    import torch

    def save(model):
        # the reference computes with the bfloat16-rounded weights (but its RoPE tables stay float32)
        model.load_state_dict({name: w.to(torch.bfloat16).float() for name, w in model.state_dict().items()})
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="100KB")
        assert len(list(tmp_path.glob("model-*.safetensors"))) > 1 and (tmp_path / "model.safetensors.index.json").exists()
        return tmp_path

    check_against_transformers(ARCHITECTURES["gemma3"], save, "c")


@pytest.mark.parametrize("arch", GGUF_ARCHITECTURES)
def test_gguf_conversion_equals_transformers(arch, module_kernel_set, tmp_path):
    from tests.helpers.hf_to_gguf import write_model_gguf
    check_against_transformers(GGUF_ARCHITECTURES[arch], lambda model: write_model_gguf(model, arch, tmp_path / "m.gguf"),
                               module_kernel_set)


def test_the_gemma2_comparison_sees_its_caps_and_windows():
    """Without its soft caps, or without its sliding windows, the test model answers differently: the comparison
    above would catch a cap or window tinyvllm ignored."""
    import torch
    torch.manual_seed(0)
    model = gemma2().float().eval()
    prompt = np.random.default_rng(1).integers(0, VOCAB, PROMPT).tolist()
    reference = transformers_logprobs(model, prompt)
    model.config.final_logit_softcapping = None
    assert np.abs(transformers_logprobs(model, prompt) - reference).max() > 0.1
    model.config.final_logit_softcapping = 0.3
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = None
    assert np.abs(transformers_logprobs(model, prompt) - reference).max() > 0.1
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping, layer.self_attn.sliding_window = 0.5, None
    model.config.layer_types = ["full_attention"] * 3
    assert np.abs(transformers_logprobs(model, prompt) - reference).max() > 0.1


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma2"])
def test_the_gpu_path_with_joined_products_equals_transformers(arch, tmp_path, monkeypatch):
    """On a device with local memory q|k|v and gate|up are joined at load, the products' outputs split back, and
    attention reads the cache in place (workers/paged_products.py): with q/k/v biases (Qwen2), q/k norms (Qwen3),
    GeGLU, output norms and windows (Gemma 2) the prompt's log-probabilities still equal transformers'. The path run
    on the CPU, as tests/workers/test_quantized_weight.py runs it."""
    from tinyvllm.workers import kernel_set, model as model_module
    from tinyvllm.workers.gpu_matvec import gpu_matvec
    monkeypatch.setattr(kernel_set, "gpu_matvec_device", lambda device: True)
    monkeypatch.setattr(model_module, "gpu_matvec", lambda h, w, layout, rows_in: gpu_matvec(h, w, None, rows_in))
    split, joined = model_module.split_products, []  # how many products each split had
    monkeypatch.setattr(model_module, "split_products", lambda outputs, sizes: joined.append(len(outputs)) or
                        split(outputs, sizes))
    check_against_transformers(ARCHITECTURES[arch], lambda model: model.save_pretrained(tmp_path) or tmp_path, "tinygrad")
    assert joined and all(n == 1 for n in joined), joined  # each layer's q|k|v (and gate|up) one product
