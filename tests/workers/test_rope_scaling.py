"""RoPE scaling (protocol/rope_scaling.py) against transformers: the inverse frequencies and attention factor of
`linear`, `llama3` and `yarn` equal modeling_rope_utils'; llama.cpp's rope_freqs.weight form equals llama3; other
types are refused at load naming what is supported; and a tiny random Llama with each scaling, saved by
transformers, gives transformers' float32 log-probabilities at positions past its original context, under both
kernel sets."""
import numpy as np
import pytest

from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.protocol.rope_scaling import rope_frequencies

ORIGINAL = 32  # the original context: the prompt goes well past it
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
}


def hf_config(scaling: dict | None):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=96, max_position_embeddings=4 * ORIGINAL * 2,
                       rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, rope_scaling=scaling)


@pytest.mark.parametrize("kind", SCALINGS)
def test_frequencies_equal_transformers(kind):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = hf_config(dict(SCALINGS[kind]))
    hf_inv_freq, hf_factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    inv_freq, factor = rope_frequencies(16, 10000.0, SCALINGS[kind], config.max_position_embeddings)
    np.testing.assert_allclose(inv_freq, hf_inv_freq.double().numpy(), rtol=1e-6)
    assert factor == pytest.approx(hf_factor, rel=1e-6)


def test_rope_freqs_weight_is_llama3_as_llama_cpp_writes_it():
    plain, _ = rope_frequencies(16, 10000.0, None, 256)
    llama3, _ = rope_frequencies(16, 10000.0, SCALINGS["llama3"], 256)
    from_weight, _ = rope_frequencies(16, 10000.0, {"rope_type": "rope_freqs"}, 256, (plain / llama3).astype(np.float32))
    np.testing.assert_allclose(from_weight, llama3, rtol=1e-6)


@pytest.mark.parametrize("scaling, words", [
    ({"rope_type": "longrope", "factor": 2.0}, r"unsupported rope_scaling type 'longrope' \(supported: linear, llama3"),
    ({"type": "dynamic", "factor": 2.0}, "unsupported rope_scaling type 'dynamic'"),
    ({"rope_type": "linear"}, "needs a factor"),
])
def test_other_scalings_are_refused_at_load(scaling, words):
    with pytest.raises(ValueError, match=words):
        ModelConfig.from_hf_config({**hf_config(None).to_dict(), "architectures": ["LlamaForCausalLM"],
                                    "rope_scaling": scaling})


@pytest.fixture(scope="module")
def prompt():
    return np.random.default_rng(3).integers(0, 128, 3 * ORIGINAL).tolist()


@pytest.mark.parametrize("kind", SCALINGS)
def test_logprobs_past_the_original_context_equal_transformers(kind, prompt, module_kernel_set, tmp_path):
    import torch
    from transformers import LlamaForCausalLM

    from tests.workers.test_architectures import tinyvllm_prompt_logprobs, transformers_logprobs
    torch.manual_seed(0)
    model = LlamaForCausalLM(hf_config(dict(SCALINGS[kind]))).float().eval()
    model.save_pretrained(tmp_path)
    expected = transformers_logprobs(model, prompt)
    got, sampled = tinyvllm_prompt_logprobs(tmp_path, prompt, module_kernel_set)
    np.testing.assert_allclose(got, expected[np.arange(len(prompt) - 1), prompt[1:]], rtol=1e-4, atol=1e-4)
    assert sampled == int(expected[-1].argmax())
