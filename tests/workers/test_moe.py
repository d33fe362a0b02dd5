"""Mixtures of experts, tiny random models made and saved by transformers (Qwen3-MoE: softmax routing over 8
experts, 2 per token, q/k norms, unnormalised and normalised top-k weights; Mixtral: Llama's layers with 4 experts;
gpt-oss, its Hugging Face folder: attention sinks, alternating sliding windows with YaRN, biases on the attention
output, the router and the experts, its clamped SwiGLU over interleaved gate and up):
tinyvllm's prompt log-probabilities equal transformers' float32 ones within 1e-4 and the greedy next token is the
same, under both kernel sets, from the folder and from the GGUF llama.cpp's converter would write. A decode step reads
only the experts its tokens were routed to: every other expert's weights are NaN, and its logits stay the model's."""
import numpy as np
import pytest

from tests.workers.test_architectures import CONTEXT, VOCAB, check_against_transformers, model_prompt_logprobs


def qwen3moe(norm_topk_prob=False):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=norm_topk_prob, max_position_embeddings=CONTEXT, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False))


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM
    return MixtralForCausalLM(MixtralConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=CONTEXT,
        rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=None))


def gpt_oss():
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM
    model = GptOssForCausalLM(GptOssConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, sliding_window=37,
        max_position_embeddings=CONTEXT, rms_norm_eps=1e-5))
    model.set_attn_implementation("eager")
    with torch.no_grad():  # sinks, biases and gate/up values past the clamp, of the size that matters
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
            layer.self_attn.o_proj.bias.normal_(0.0, 0.5)
            layer.mlp.router.bias.normal_(0.0, 1.0)
            layer.mlp.experts.gate_up_proj.normal_(0.0, 1.0)
            layer.mlp.experts.gate_up_proj_bias.normal_(0.0, 1.0)
            layer.mlp.experts.down_proj_bias.normal_(0.0, 0.5)
    return model


MODELS = {"qwen3moe": qwen3moe, "qwen3moe-normalised": lambda: qwen3moe(True), "mixtral": mixtral, "gpt-oss": gpt_oss}
GGUF_ARCH = {"qwen3moe": "qwen3moe", "qwen3moe-normalised": "qwen3moe", "mixtral": "llama"}


@pytest.mark.parametrize("name", MODELS)
def test_prompt_logprobs_equal_transformers(name, module_kernel_set, tmp_path):
    check_against_transformers(MODELS[name], lambda model: model.save_pretrained(tmp_path) or tmp_path,
                               module_kernel_set)


@pytest.mark.parametrize("name", ["qwen3moe-normalised", "mixtral", "mixtral-per-expert-tensors"])
def test_gguf_conversion_equals_transformers(name, module_kernel_set, tmp_path):
    """mixtral-per-expert-tensors: the file layout of llama.cpp's Mixtral conversions from before 3-d experts."""
    from tests.helpers.hf_to_gguf import write_model_gguf
    per_expert = name.endswith("per-expert-tensors")
    name = name.removesuffix("-per-expert-tensors")
    check_against_transformers(MODELS[name], lambda model: write_model_gguf(
        model, GGUF_ARCH[name], tmp_path / "m.gguf", per_expert=per_expert), module_kernel_set)


def test_a_step_reads_only_the_experts_its_tokens_were_routed_to(module_kernel_set, tmp_path):
    import torch
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.weights import load_weights
    torch.manual_seed(0)
    model = qwen3moe(True).float().eval()
    model.save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").touch()  # a model folder has one; the weights do not need it
    prompt = [5, 77]
    with torch.no_grad():
        out = model(torch.tensor([prompt]), output_router_logits=True)
    expected = torch.log_softmax(out.logits[0].double(), -1).numpy()
    cfg, weights = load_weights(tmp_path)
    poisoned = 0
    for i, router_logits in enumerate(out.router_logits):  # [tokens, experts] per layer
        routed = set(router_logits.topk(cfg.n_experts_used, -1).indices.flatten().tolist())
        for kind, rows in (("gate", cfg.expert_ffn_dim), ("up", cfg.expert_ffn_dim), ("down", cfg.dim)):
            w = np.array(weights[f"blk.{i}.ffn_{kind}_exps.weight"])
            for expert in set(range(cfg.n_experts)) - routed:
                w[expert * rows:(expert + 1) * rows] = np.nan
                poisoned += 1
            weights[f"blk.{i}.ffn_{kind}_exps.weight"] = w
    assert poisoned >= 3 * 2 * (cfg.n_experts - 2 * cfg.n_experts_used)  # most experts hold NaN in every layer
    got, sampled = model_prompt_logprobs(Transformer(cfg, weights, CONTEXT, kernels=module_kernel_set), prompt)
    np.testing.assert_allclose(got, [expected[0, prompt[1]]], rtol=1e-4, atol=1e-4)
    assert sampled == int(expected[-1].argmax())


def test_tensor_parallel_ranks_hold_a_share_of_every_expert_and_their_sums_are_the_mlp(module_kernel_set, tmp_path):
    """Each of two ranks holds half of every expert's width (gate and up by rows, down by columns) and the whole router:
    its MLP output is a partial sum, and the two add up to the unsharded MLP's; a pipeline stage takes its layers'
    experts whole."""
    import torch
    from tinygrad import Tensor
    from tinyvllm.protocol.parallel_layout import ShardSpec
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.tensor_parallel import shard_weights
    from tinyvllm.workers.weights import load_weights
    torch.manual_seed(0)
    qwen3moe(True).save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").touch()
    cfg, weights = load_weights(tmp_path)
    x = Tensor(np.random.default_rng(4).standard_normal((5, cfg.dim)).astype(np.float32))
    whole = Transformer(cfg, weights, CONTEXT, kernels=module_kernel_set).mlp(1, x).numpy()
    parts = []
    for rank in range(2):
        local_cfg, local, vocab_start = shard_weights(cfg, weights, ShardSpec(rank, 2))
        assert local_cfg.expert_ffn_dim == 16 and local["blk.1.ffn_up_exps.weight"].shape == (8 * 16, 64)
        assert local["blk.1.ffn_down_exps.weight"].shape == (8 * 64, 16)
        parts.append(Transformer(local_cfg, local, CONTEXT, kernels=module_kernel_set,
                                 vocab_start=vocab_start).mlp(1, x).numpy())
    np.testing.assert_allclose(parts[0] + parts[1], whole, rtol=1e-4, atol=1e-5)
    assert np.abs(parts[0] - whole).max() > 1e-3  # a rank's share alone is not the whole
    local_cfg, local, _ = shard_weights(cfg, weights, ShardSpec(0, 1, 1, 2))
    assert local_cfg.n_layers == 1 and local["blk.0.ffn_gate_exps.weight"].shape == (8 * 32, 64)


def test_a_bfloat16_folders_experts_stay_bfloat16(module_kernel_set, tmp_path):
    """Per-expert bfloat16 matrices are stacked as bfloat16 blocks, not widened (a 30B folder would need 4x its size),
    and compute what their float32 values do."""
    import torch
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.weights import load_weights
    torch.manual_seed(0)
    qwen3moe().to(torch.bfloat16).save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").touch()
    cfg, weights = load_weights(tmp_path)
    experts = weights["blk.0.ffn_down_exps.weight"]
    assert type(experts).__name__ == "QuantizedArray" and experts.type_name == "BF16" and experts.shape == (8 * 64, 32)
    prompt = list(range(3, 40))
    got = model_prompt_logprobs(Transformer(cfg, weights, CONTEXT, kernels=module_kernel_set), prompt)
    cfg, floats = load_weights(tmp_path, keep_quantized=False)
    want = model_prompt_logprobs(Transformer(cfg, floats, CONTEXT, kernels=module_kernel_set), prompt)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_experts_kept_quantised_compute_what_their_float_values_do(module_kernel_set, tmp_path):
    """A GGUF with Q8_0 experts: the products on its blocks give the logprobs of the same values as float32."""
    import torch
    from tests.helpers.hf_to_gguf import write_model_gguf
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.weights import load_weights
    torch.manual_seed(0)
    path = write_model_gguf(qwen3moe(True).float().eval(), "qwen3moe", tmp_path / "m.gguf", expert_type="Q8_0")
    prompt = np.random.default_rng(2).integers(0, VOCAB, 40).tolist()
    cfg, quantised = load_weights(path)
    assert type(quantised["blk.0.ffn_down_exps.weight"]).__name__ == "QuantizedArray"
    got = model_prompt_logprobs(Transformer(cfg, quantised, CONTEXT, kernels=module_kernel_set), prompt)
    cfg, floats = load_weights(path, keep_quantized=False)
    want = model_prompt_logprobs(Transformer(cfg, floats, CONTEXT, kernels=module_kernel_set), prompt)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert got[1] == want[1]


def test_gpt_oss_is_not_split_over_tensor_parallel_ranks_yet(tmp_path):
    import torch
    from tinyvllm.protocol.parallel_layout import ShardSpec
    from tinyvllm.workers.tensor_parallel import shard_weights
    from tinyvllm.workers.weights import load_weights
    torch.manual_seed(0)
    gpt_oss().save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").touch()
    cfg, weights = load_weights(tmp_path)
    assert (cfg.arch, cfg.attention_sinks, cfg.expert_bias, cfg.swiglu_limit, cfg.layer_windows) == \
        ("gpt-oss", True, True, 7.0, (37, 0))
    with pytest.raises(ValueError, match="attention sinks and expert biases"):
        shard_weights(cfg, weights, ShardSpec(0, 2))


def test_expert_configs_and_what_is_refused():
    from tinyvllm.protocol.model_config import ModelConfig
    base = {"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 128, "max_position_embeddings": 1024}
    qwen = ModelConfig.from_hf_config({"architectures": ["Qwen3MoeForCausalLM"], **base, "num_experts": 128,
                                       "num_experts_per_tok": 8, "moe_intermediate_size": 32, "norm_topk_prob": True})
    assert (qwen.arch, qwen.qk_norm, qwen.n_experts, qwen.n_experts_used, qwen.expert_ffn_dim, qwen.norm_topk_prob) == \
        ("qwen3moe", True, 128, 8, 32, True)
    mixtral = ModelConfig.from_hf_config({"architectures": ["MixtralForCausalLM"], **base, "num_local_experts": 8,
                                          "num_experts_per_tok": 2})
    assert (mixtral.arch, mixtral.n_experts, mixtral.expert_ffn_dim, mixtral.norm_topk_prob) == ("llama", 8, 128, True)
    assert ModelConfig.from_hf_config({"architectures": ["LlamaForCausalLM"], **base}).n_experts == 0
    unsaid = ModelConfig.from_hf_config({"architectures": ["Qwen3MoeForCausalLM"], **base, "num_experts": 8,
                                         "num_experts_per_tok": 2})
    assert not unsaid.norm_topk_prob  # transformers' default for Qwen3-MoE
    with pytest.raises(ValueError, match="mix dense and expert"):
        ModelConfig.from_hf_config({"architectures": ["Qwen3MoeForCausalLM"], **base, "num_experts": 8,
                                    "num_experts_per_tok": 2, "mlp_only_layers": [0]})
    with pytest.raises(ValueError, match="gpt-oss GGUFs"):
        ModelConfig.from_gguf_metadata({"general.architecture": "gpt-oss"})


def test_int8_activations_take_the_expert_kernels_and_stay_near_the_float_model(tmp_path):
    """The CPU's default set (c-int8) multiplies Q8_0 experts with int8 activations (matvec_i8's expert rows): within
    the activations' quantisation error of the float products."""
    import torch
    from tests.helpers.hf_to_gguf import write_model_gguf
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.weights import load_weights
    torch.manual_seed(0)
    path = write_model_gguf(qwen3moe(True).float().eval(), "qwen3moe", tmp_path / "m.gguf", expert_type="Q8_0")
    prompt = np.random.default_rng(3).integers(0, VOCAB, 40).tolist()
    cfg, weights = load_weights(path)
    got, _ = model_prompt_logprobs(Transformer(cfg, weights, CONTEXT, kernels="c-int8"), prompt)
    want, _ = model_prompt_logprobs(Transformer(cfg, weights, CONTEXT, kernels="c"), prompt)
    print(f"largest logprob difference, int8 against float activations: {np.abs(got - want).max():.2e}")
    assert 0 < np.abs(got - want).max() < 0.05
