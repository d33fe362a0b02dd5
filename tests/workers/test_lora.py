"""LoRA adapters made by peft on a tiny random Llama (rank 8 on the attention's q and v, rank 16 on k, o and the whole
MLP; random A and B, not peft's zero B): tinyvllm's prompt log-probabilities with each adapter equal transformers +
peft's float32 ones within 1e-4, under both exact kernel sets, and a step that mixes the base model and both adapters
gives each request what it gets alone; with one slot, the second adapter replaces the first between steps."""
import numpy as np
import pytest

from tests.workers.test_architectures import CONTEXT, VOCAB

PROMPTS = [np.random.default_rng(seed).integers(0, VOCAB, 37).tolist() for seed in (1, 2, 3)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(the base model's folder, {adapter name: (its folder, transformers + peft's log-probabilities per prompt)},
    the base model's log-probabilities per prompt)"""
    import torch
    from tests.helpers.tiny_lora import make_llama_with_adapters
    base_folder, adapters, base = make_llama_with_adapters(tmp_path_factory.mktemp("lora"), VOCAB, tokenizer=False)

    def logprobs(model) -> list[np.ndarray]:
        with torch.no_grad():
            return [torch.log_softmax(model(torch.tensor([p])).logits[0].double(), -1).numpy() for p in PROMPTS]

    return base_folder, {name: (folder, logprobs(tuned)) for name, (folder, tuned) in adapters.items()}, logprobs(base)


def run(model, requests: list[tuple[list[int], object]], first_block: int = 0) -> list[np.ndarray]:
    """One step of every (prompt, adapter) request: each one's prompt log-probabilities."""
    from tinyvllm.protocol.messages import NewRequestData, StepPlan
    from tinyvllm.protocol.sampling import SamplingParams
    from tinyvllm.workers.kv_cache import PagedKVCache
    from tinyvllm.workers.model_runner import ModelRunner
    runner = ModelRunner(model, PagedKVCache(model.cfg, CONTEXT // 4, 4), max_num_seqs=4, max_model_len=CONTEXT,
                         max_num_batched_tokens=256)
    new, blocks = [], first_block
    for i, (prompt, adapter) in enumerate(requests):
        sp = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0, lora=adapter)
        n = -(-len(prompt) // 4)
        new.append(NewRequestData(f"r{i}", prompt, sp, list(range(blocks, blocks + n)), 0, len(prompt)))
        blocks += n
    result = runner.execute(StepPlan(1, new, [], []))
    return [np.array([e.logprob for e in lps]) for lps in result.prompt_logprobs]


def expected(logprobs: np.ndarray, prompt: list[int]) -> np.ndarray:
    return logprobs[np.arange(len(prompt) - 1), prompt[1:]]


def served(base_folder, kernels: str, slots: int = 2):
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.weights import load_weights
    cfg, weights = load_weights(base_folder)
    model = Transformer(cfg, weights, CONTEXT, kernels=kernels)
    model.serve_adapters(slots, 16)
    return model


def test_each_adapter_equals_transformers_with_peft_and_a_mixed_step_equals_each_alone(models, module_kernel_set):
    from tinyvllm.protocol.sampling import LoRARequest
    base_folder, adapters, base_logprobs = models
    model = served(base_folder, module_kernel_set)
    lora = {name: LoRARequest(name, 1, str(folder)) for name, (folder, _) in adapters.items()}
    mixed = run(model, [(PROMPTS[0], None), (PROMPTS[1], lora["small"]), (PROMPTS[2], lora["wide"])])
    references = [base_logprobs[0], adapters["small"][1][1], adapters["wide"][1][2]]
    for got, reference, prompt in zip(mixed, references, PROMPTS):
        np.testing.assert_allclose(got, expected(reference, prompt), rtol=1e-4, atol=1e-4)
    for i, adapter in enumerate((None, lora["small"], lora["wide"])):
        alone, = run(model, [(PROMPTS[i], adapter)])
        np.testing.assert_allclose(alone, mixed[i], rtol=1e-5, atol=1e-5)
    # the adapters change the outputs: these comparisons could not pass by a no-op
    assert np.abs(expected(adapters["small"][1][1], PROMPTS[1]) - expected(base_logprobs[1], PROMPTS[1])).max() > 0.05
    assert np.abs(expected(adapters["wide"][1][2], PROMPTS[2]) - expected(base_logprobs[2], PROMPTS[2])).max() > 0.05


def test_one_slot_serves_one_adapter_per_step_and_reloads_between_steps(models):
    from tinyvllm.protocol.lora_adapter import LoRAError
    from tinyvllm.protocol.sampling import LoRARequest
    base_folder, adapters, _ = models
    model = served(base_folder, "c", slots=1)
    for name in ("small", "wide", "small"):
        got, = run(model, [(PROMPTS[0], LoRARequest(name, 1, str(adapters[name][0])))])
        np.testing.assert_allclose(got, expected(adapters[name][1][0], PROMPTS[0]), rtol=1e-4, atol=1e-4)
    with pytest.raises(LoRAError, match="more than --max-loras 1"):
        model.lora.activate([LoRARequest(n, 1, str(adapters[n][0])) for n in adapters])


def test_adapters_that_do_not_fit_are_refused(models, tmp_path):
    from tinyvllm.protocol.lora_adapter import LoRAError, read_lora_adapter
    from tinyvllm.protocol.model_config import read_model_config
    base_folder, adapters, _ = models
    cfg = read_model_config(base_folder)
    with pytest.raises(LoRAError, match="rank 16, more than --max-lora-rank 8"):
        read_lora_adapter(adapters["wide"][0], cfg, 8)
    with pytest.raises(LoRAError, match="no PEFT LoRA adapter"):
        read_lora_adapter(tmp_path, cfg, 16)
    import dataclasses
    with pytest.raises(LoRAError, match="does not fit this model"):
        read_lora_adapter(adapters["small"][0], dataclasses.replace(cfg, dim=32), 16)


def test_a_llama_cpp_lora_gguf_serves_as_its_peft_folder(models, tmp_path):
    """llama.cpp's LoRA GGUF of the rank-8 q/v adapter (alpha 16) reads as the same A and scaled B, and a step with it
    equals transformers + peft."""
    from tests.helpers.tiny_lora import write_lora_gguf
    from tinyvllm.protocol.lora_adapter import read_lora_adapter
    from tinyvllm.protocol.model_config import read_model_config
    from tinyvllm.protocol.sampling import LoRARequest
    base_folder, adapters, _ = models
    cfg = read_model_config(base_folder)
    path = write_lora_gguf(adapters["small"][0], tmp_path / "small.gguf", cfg, 16.0)
    from_gguf, from_peft = read_lora_adapter(path, cfg, 16), read_lora_adapter(adapters["small"][0], cfg, 16)
    assert from_gguf.keys() == from_peft.keys() and len(from_gguf) == 2 * cfg.n_layers
    for key in from_peft:
        np.testing.assert_allclose(from_gguf[key][0], from_peft[key][0], rtol=1e-6)
        np.testing.assert_allclose(from_gguf[key][1], from_peft[key][1], rtol=1e-6)
    got, = run(served(base_folder, "c"), [(PROMPTS[1], LoRARequest("small", 1, str(path)))])
    np.testing.assert_allclose(got, expected(adapters["small"][1][1], PROMPTS[1]), rtol=1e-4, atol=1e-4)
