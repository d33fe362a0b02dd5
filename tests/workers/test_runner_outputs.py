"""What ModelRunner.execute returns besides tokens, against the dense float64 reference: sampled-token logprobs,
prompt logprobs across chunked prefill (and through a one-token chunk), and mean-pooled, L2-normalised
embeddings; the step's sampled rows and their order are unaffected."""
import numpy as np
import pytest

from tinyvllm.protocol.messages import CachedRequestData, NewRequestData, StepPlan
from tinyvllm.protocol.sampling import SamplingParams
from tests.workers.dense_reference import dense_hidden, dense_logits, random_llama
from tests.workers.test_paged_attention import CFG
from tinyvllm.workers.collective import HostGroup
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.model_runner import ModelRunner

BLOCK_SIZE = 4


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.fixture(scope="module", params=["one-forward", "sharded-pieces"])
def setup(module_kernel_set, request):
    """sharded-pieces: the tensor-parallel forward (workers/sharded_forward.py: a jit per piece between the
    reduction points, logits gathered in chunks for prompt logprobs) with a group of one rank."""
    weights = random_llama(CFG, seed=4)
    weights["output.weight"] = np.random.default_rng(5).standard_normal((CFG.vocab_size, CFG.dim)).astype(np.float32) * 0.3
    model = Transformer(CFG, weights, CFG.max_context, kernels=module_kernel_set)
    group = HostGroup("unused", 0, 1, max_bytes=4 * 3 * CFG.vocab_size) if request.param == "sharded-pieces" else None
    runner = ModelRunner(model, PagedKVCache(CFG, 32, BLOCK_SIZE), max_num_seqs=2, max_model_len=64,
                         max_num_batched_tokens=8, group=group)
    return weights, runner


def test_prompt_and_sample_logprobs_match_the_dense_model(setup):
    weights, runner = setup
    prompt = np.random.default_rng(6).integers(0, CFG.vocab_size, 13).tolist()
    sp = SamplingParams(temperature=0, logprobs=2, prompt_logprobs=3)
    blocks = [0, 1, 2, 3]
    # Chunks [0, 8), [8, 12), [12, 13): the last, one token long, samples the first output token.
    r1 = runner.execute(StepPlan(1, [NewRequestData("p", prompt, sp, blocks, 0, 8)], [], []))
    r2 = runner.execute(StepPlan(2, [], [CachedRequestData("p", [], 8, 4)], []))
    r3 = runner.execute(StepPlan(3, [], [CachedRequestData("p", [], 12, 1)], []))
    assert r1.req_ids == r2.req_ids == [] and r3.req_ids == ["p"]
    expected = log_softmax(dense_logits(CFG, weights, prompt))
    plps = r3.prompt_logprobs[0]
    assert [e.token_id for e in plps] == prompt[1:]
    for pos, entry in enumerate(plps):  # position pos predicts prompt[pos + 1]
        np.testing.assert_allclose(entry.logprob, expected[pos, prompt[pos + 1]], atol=1e-4)
        assert entry.top_token_ids == np.argsort(-expected[pos])[:3].tolist()
        np.testing.assert_allclose(entry.top_logprobs, np.sort(expected[pos])[::-1][:3], atol=1e-4)
    token, lp = r3.sampled_token_ids[0], r3.logprobs[0]
    assert token == int(expected[-1].argmax()) and lp.token_id == token
    np.testing.assert_allclose(lp.logprob, expected[-1, token], atol=1e-4)
    assert lp.top_token_ids == np.argsort(-expected[-1])[:2].tolist()
    # The next step is a plain decode: logprobs again, prompt logprobs never twice.
    r4 = runner.execute(StepPlan(4, [], [CachedRequestData("p", [], 13, 1, [token])], []))
    expected = log_softmax(dense_logits(CFG, weights, prompt + [token]))
    np.testing.assert_allclose(r4.logprobs[0].logprob, expected[-1, r4.sampled_token_ids[0]], atol=1e-4)
    assert r4.prompt_logprobs == []
    runner.execute(StepPlan(5, [], [], ["p"]))


def test_embedding_is_the_normalised_mean_of_final_hidden_states(setup):
    weights, runner = setup
    rng = np.random.default_rng(7)
    prompt, other = rng.integers(0, CFG.vocab_size, 11).tolist(), rng.integers(0, CFG.vocab_size, 3).tolist()
    embed = SamplingParams(embed=True)
    r1 = runner.execute(StepPlan(1, [NewRequestData("e", prompt, embed, [4, 5, 6], 0, 8),
                                     NewRequestData("g", other, SamplingParams(temperature=0), [7], 0, 3)], [], []))
    assert r1.pooled_req_ids == [] and r1.req_ids == ["g"]
    r2 = runner.execute(StepPlan(2, [], [CachedRequestData("e", [], 8, 3)], []))
    assert r2.req_ids == [] and r2.pooled_req_ids == ["e"]
    mean = dense_hidden(CFG, weights, prompt).mean(0)
    np.testing.assert_allclose(r2.embeddings[0], mean / np.linalg.norm(mean), atol=1e-5)
    single = runner.execute(StepPlan(3, [NewRequestData("one", [5], embed, [8], 0, 1)], [], ["e", "g"]))
    h = dense_hidden(CFG, weights, [5])[0]
    np.testing.assert_allclose(single.embeddings[0], h / np.linalg.norm(h), atol=1e-5)


def test_scores_are_the_last_positions_logits_of_the_asked_tokens(setup):
    weights, runner = setup
    rng = np.random.default_rng(8)
    long, short, other = (rng.integers(0, CFG.vocab_size, n).tolist() for n in (10, 3, 4))
    ids_a, ids_b = [7, 3], [CFG.vocab_size - 1, 0, 5]
    a, b = SamplingParams(score_token_ids=ids_a), SamplingParams(score_token_ids=ids_b)
    r1 = runner.execute(StepPlan(1, [NewRequestData("a", long, a, [9, 10, 11], 0, 6),
                                     NewRequestData("b", short, b, [12], 0, 3)], [], []))
    assert r1.req_ids == [] and r1.pooled_req_ids == ["b"]  # a's prompt goes on in the next step
    np.testing.assert_allclose(r1.embeddings[0], dense_logits(CFG, weights, short)[-1, ids_b], atol=1e-4)
    r2 = runner.execute(StepPlan(2, [NewRequestData("g", other, SamplingParams(temperature=0), [13], 0, 4)],
                                 [CachedRequestData("a", [], 6, 4)], ["b"]))
    assert r2.req_ids == ["g"] and r2.sampled_token_ids == [int(dense_logits(CFG, weights, other)[-1].argmax())]
    assert r2.pooled_req_ids == ["a"]
    np.testing.assert_allclose(r2.embeddings[0], dense_logits(CFG, weights, long)[-1, ids_a], atol=1e-4)
    runner.execute(StepPlan(3, [], [], ["a", "g"]))
