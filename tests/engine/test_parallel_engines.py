"""One model over several worker processes (real scheduler and workers, tiny random model): tensor-parallel,
pipeline-parallel and both give the single worker's greedy tokens.

Tensor parallelism sums each layer's partial results in another order than one worker does, so two nearly tied
logits may swap: a comparison stops at the first difference only where the whole model's top two logits there
are within TIE_GAP (a near-tie, said in the output), and must still cover most tokens. The engines run the exact
float32 kernels ("c"): the near-tie is judged on the float model, and int8 activations (the default "c-int8")
move logits by ~0.1, so their own near-ties are not the float model's (measured: a float gap of 0.28 that int8
makes 0.05, which tensor parallelism's other order then swapped)."""
import numpy as np
import pytest

from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.workers.weights import load_weights
from tests.helpers.tiny_model import make_shallow_default_gguf, make_tiny_gguf
from tests.workers.dense_reference import dense_logits

N_TOKENS = 10
GREEDY = SamplingParams(temperature=0, max_tokens=N_TOKENS, ignore_eos=True)
TIE_GAP = 1e-3
ENGINE = dict(max_num_seqs=4, num_kv_blocks=64, max_num_batched_tokens=32, max_model_len=256, kernels="c")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return str(make_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", n_layers=4))


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(3)
    return [rng.integers(100, 40000, n).tolist() for n in (3, 37, 90)]  # 90: prefilled in chunks of the budget


@pytest.fixture(scope="module")
def reference(tiny_model, prompts):
    with LLM(tiny_model, **ENGINE) as llm:
        return [r.token_ids for r in llm.generate(prompts, GREEDY)]


def assert_same_greedy(model_path, prompts, reference, got):
    cfg, weights = None, None
    compared = 0
    for prompt, want, have in zip(prompts, reference, got):
        diff = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), None)
        if diff is None:
            assert have == want
            compared += len(want)
            continue
        if cfg is None:
            cfg, weights = load_weights(model_path, keep_quantized=False)
        top2 = np.sort(dense_logits(cfg, weights, prompt + want[:diff])[-1])[-2:]
        assert top2[1] - top2[0] < TIE_GAP, f"differs at token {diff} where the logits are not tied: {want} vs {have}"
        print(f"{len(prompt)}-token prompt: near-tie at token {diff} (gap {top2[1] - top2[0]:.2e}), compared {diff}")
        compared += diff
    assert compared >= 2 * N_TOKENS


@pytest.mark.parametrize("tp,pp", [(2, 1), (4, 1), (1, 2), (2, 2)], ids=["tp2", "tp4-replicated-kv", "pp2", "tp2xpp2"])
def test_sharded_engines_give_the_single_workers_tokens(tiny_model, prompts, reference, tp, pp):
    with LLM(tiny_model, tensor_parallel_size=tp, pipeline_parallel_size=pp, **ENGINE) as llm:
        got = [r.token_ids for r in llm.generate(prompts, GREEDY)]
    if tp == 1:
        assert got == reference  # a pipeline adds nothing up differently: exactly the same tokens
    else:
        assert_same_greedy(tiny_model, prompts, reference, got)


def test_a_tensor_parallel_worker_holds_half_the_weights(tiny_model):
    with LLM(tiny_model, **ENGINE) as whole:
        alone = whole.ready.worker_weight_bytes
    with LLM(tiny_model, tensor_parallel_size=2, **ENGINE) as split:
        shares = split.ready.worker_weight_bytes
    print(f"weight bytes: one worker {alone[0]}, two ranks {shares}")
    assert len(alone) == 1 and len(shares) == 2
    assert all(0.45 * alone[0] < share < 0.55 * alone[0] for share in shares)


SMOLLM2_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away, there lived a"]


@pytest.fixture(scope="module")
def smollm2(default_tokenizer, tmp_path_factory):
    """SmolLM2-135M's first 4 layers: its heads, widths and stored weight types, at a seventh of the depth."""
    path = str(make_shallow_default_gguf(tmp_path_factory.mktemp("model") / "smollm2-4-layers.gguf", n_layers=4))
    prompts = [default_tokenizer.encode(p) for p in SMOLLM2_PROMPTS]
    with LLM(path, **ENGINE) as llm:
        return path, prompts, [r.token_ids for r in llm.generate(prompts, GREEDY)]


@pytest.mark.parametrize("tp,pp", [(3, 1), (1, 2)], ids=["tp3", "pp2"])
def test_smollm2_split_over_workers_gives_the_same_tokens(smollm2, tp, pp):
    """9 query heads and 3 KV heads over 3 ranks; 4 layers over 2 stages."""
    path, prompts, reference = smollm2
    with LLM(path, tensor_parallel_size=tp, pipeline_parallel_size=pp, **ENGINE) as llm:
        got = [r.token_ids for r in llm.generate(prompts, GREEDY)]
    assert_same_greedy(path, prompts, reference, got)


def test_a_size_that_does_not_split_the_model_is_refused_at_start(default_model_path):
    with pytest.raises(ValueError, match=r"--tensor-parallel-size 2 does not split this model: the model's 9 attention "
                                         r"heads do not divide by it \(sizes that work: 1, 3\)"):
        LLM(str(default_model_path), tensor_parallel_size=2, **ENGINE)


def test_a_mixture_of_experts_split_over_two_ranks_gives_the_single_workers_tokens(tmp_path):
    """Qwen3-MoE with every expert's width split over two tensor-parallel workers (the router replicated): the
    greedy tokens and their logprobs of one worker."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from tests.helpers.hf_to_gguf import write_model_gguf
    from tests.helpers.tiny_model import VOCAB_SIZE, tokenizer_metadata
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, max_position_embeddings=256, tie_word_embeddings=True)).float().eval()
    with torch.no_grad():  # weights that make greedy decoding wander (tests/helpers/tiny_reasoning_model.py)
        model.model.embed_tokens.weight.normal_(0.0, 0.5)
        model.model.norm.weight.normal_()
    path = str(write_model_gguf(model, "qwen3moe", tmp_path / "moe.gguf", extra=tokenizer_metadata()))
    sampling = SamplingParams(temperature=0, max_tokens=N_TOKENS, ignore_eos=True, logprobs=0)
    prompts = [[1, 400, 2000, 30, 77], list(range(100, 140))]
    results = {}
    for tp in (1, 2):
        with LLM(path, tensor_parallel_size=tp, **ENGINE) as llm:
            results[tp] = [(r.token_ids, [lp.logprob for lp in r.outputs[0].logprobs])
                           for r in llm.generate(prompts, sampling)]
    for (tokens, logprobs), (tokens2, logprobs2) in zip(results[1], results[2]):
        assert tokens2 == tokens
        np.testing.assert_allclose(logprobs2, logprobs, atol=1e-4)
    assert results[1][0][0] != results[1][1][0]
