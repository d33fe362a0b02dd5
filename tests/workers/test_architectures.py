"""Architectures beyond Llama and Qwen2, each a tiny random-weight model made and saved by transformers: tinyvllm
loads the folder and its prompt log-probabilities over a prompt equal transformers' float32 ones, under both kernel
sets. Qwen3: an RMSNorm over each head's queries and keys before RoPE, and a head_dim that is not hidden/heads.
Mistral: Llama's layers; a sliding window shorter than the context is refused at load (not supported yet). Phi-3:
fused qkv and gate_up projections, split at load."""
import pathlib

import numpy as np
import pytest

VOCAB = 128


def qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=24, intermediate_size=96,
                                        max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-6,
                                        tie_word_embeddings=True))


def mistral(sliding_window=None):
    from transformers import MistralConfig, MistralForCausalLM
    return MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                                            max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-5,
                                            sliding_window=sliding_window))


def phi3():
    from transformers import Phi3Config, Phi3ForCausalLM
    return Phi3ForCausalLM(Phi3Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=256,
                                      original_max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-5,
                                      sliding_window=None, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      tie_word_embeddings=False))


ARCHITECTURES = {"qwen3": qwen3, "mistral": mistral, "phi3": phi3}


def tinyvllm_prompt_logprobs(folder: pathlib.Path, prompt: list[int], kernels: str) -> tuple[np.ndarray, int]:
    from tinyvllm.protocol.messages import NewRequestData, StepPlan
    from tinyvllm.protocol.sampling import SamplingParams
    from tinyvllm.workers.kv_cache import PagedKVCache
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.model_runner import ModelRunner
    from tinyvllm.workers.weights import load_weights
    (folder / "tokenizer.json").touch()  # a model folder has one; the weights do not need it
    cfg, weights = load_weights(folder)
    runner = ModelRunner(Transformer(cfg, weights, 128, kernels=kernels), PagedKVCache(cfg, 32, 4),
                         max_num_seqs=1, max_model_len=128, max_num_batched_tokens=128)
    sp = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    result = runner.execute(StepPlan(1, [NewRequestData("p", prompt, sp, list(range(-(-len(prompt) // 4))), 0,
                                                        len(prompt))], [], []))
    return np.array([entry.logprob for entry in result.prompt_logprobs[0]]), result.sampled_token_ids[0]


def transformers_logprobs(model, prompt: list[int]) -> np.ndarray:
    import torch
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), -1).numpy()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_prompt_logprobs_equal_transformers(arch, module_kernel_set, tmp_path):
    import torch
    torch.manual_seed(0)
    model = ARCHITECTURES[arch]().float().eval()
    model.save_pretrained(tmp_path)
    prompt = np.random.default_rng(1).integers(0, VOCAB, 100).tolist()
    expected = transformers_logprobs(model, prompt)
    got, sampled = tinyvllm_prompt_logprobs(tmp_path, prompt, module_kernel_set)
    np.testing.assert_allclose(got, expected[np.arange(len(prompt) - 1), prompt[1:]], rtol=1e-4, atol=1e-4)
    assert sampled == int(expected[-1].argmax())


def test_a_sliding_window_shorter_than_the_context_is_refused_not_run_wrong(tmp_path):
    from tinyvllm.workers.weights import load_weights
    mistral(sliding_window=16).save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").touch()
    with pytest.raises(ValueError, match="sliding-window attention .* is not supported yet"):
        load_weights(tmp_path)

