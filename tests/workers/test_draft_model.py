"""Draft-model proposals in ModelRunner (workers/draft_model.py) on tiny random models: after a step the draft
proposes its own greedy continuation of each row's new tokens (checked against a dense float64 forward of the draft),
also after a verify step that rejected drafts (their KV is overwritten); the target's tokens stay its greedy ones;
rows that may not speculate, or whose block table has no room, get no (or fewer) proposals; block copies are
mirrored in the draft's cache."""
import numpy as np
import pytest

from tinyvllm.protocol.messages import CachedRequestData, NewRequestData, StepPlan
from tinyvllm.protocol.sampling import SamplingParams
from tests.workers.dense_reference import dense_logits, random_llama
from tests.workers.test_paged_attention import CFG
from tinyvllm.protocol.speculative_config import check_draft_vocab
from tinyvllm.workers.draft_model import DraftModel
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.model_runner import ModelRunner

K, BLOCK, BLOCKS = 3, 4, 24
PROMPT = [5, 17, 42, 8, 5, 17, 42]
GREEDY = SamplingParams(temperature=0)


def make_runner(weights, draft_weights=None) -> ModelRunner:
    """A runner of `weights`, with a draft model of draft_weights if given."""
    draft = DraftModel(make_runner(draft_weights), K) if draft_weights is not None else None
    return ModelRunner(Transformer(CFG, weights, CFG.max_context), PagedKVCache(CFG, BLOCKS, BLOCK), max_num_seqs=4,
                       max_model_len=64, max_num_batched_tokens=16, draft=draft)


@pytest.fixture(scope="module")
def models():
    target, draft = random_llama(CFG, seed=4), random_llama(CFG, seed=9)
    for i, w in enumerate((target, draft)):  # an untied head of some spread: greedy wanders over the vocabulary
        w["output.weight"] = np.random.default_rng(5 + i).standard_normal((CFG.vocab_size, CFG.dim)).astype(np.float32)
    return target, draft, make_runner(target, draft)


def greedy_continuation(weights, tokens: list[int], n: int) -> list[int]:
    tokens = list(tokens)
    for _ in range(n):
        tokens.append(int(dense_logits(CFG, weights, tokens)[-1].argmax()))
    return tokens[-n:] if n else []


def test_proposals_are_the_drafts_greedy_tokens_and_survive_rejections(models):
    target, draft, runner = models
    first = runner.execute(StepPlan(1, [NewRequestData("a", PROMPT, GREEDY, [0, 1, 2], 0, len(PROMPT))], [], []))
    (token,) = first.sampled_token_ids
    assert token == greedy_continuation(target, PROMPT, 1)[0]
    tokens = PROMPT + [token]
    proposals = first.proposed_draft_ids[0]
    assert proposals == greedy_continuation(draft, tokens, K)  # positions 7..9 of its 12 slots
    # verify them: the target accepts the leading ones that are its own greedy tokens, then its token
    second = runner.execute(StepPlan(2, [], [CachedRequestData("a", [3], len(PROMPT), 1 + K, [token],
                                                                draft_token_ids=proposals)], []))
    new = second.accepted_draft_ids[0] + second.sampled_token_ids if second.accepted_draft_ids else \
        second.sampled_token_ids
    assert new == greedy_continuation(target, tokens, len(new))
    assert second.proposed_draft_ids[0] == greedy_continuation(draft, tokens + new, K)
    runner.execute(StepPlan(3, [], [], ["a"]))


def test_the_target_as_its_own_draft_is_always_accepted(models):
    target, _, _ = models
    runner = make_runner(target, target)
    first = runner.execute(StepPlan(1, [NewRequestData("a", PROMPT, GREEDY, [0, 1, 2, 3], 0, len(PROMPT))], [], []))
    tokens = PROMPT + first.sampled_token_ids
    second = runner.execute(StepPlan(2, [], [CachedRequestData("a", [], len(PROMPT), 1 + K, tokens[-1:],
                                                                draft_token_ids=first.proposed_draft_ids[0])], []))
    assert second.accepted_draft_ids == first.proposed_draft_ids
    assert second.accepted_draft_ids[0] + second.sampled_token_ids == greedy_continuation(target, tokens, K + 1)


def test_no_proposals_where_drafts_would_not_verify_exactly_or_slots_lack(models):
    _, draft, runner = models
    rows = [("greedy", GREEDY, [4, 5]), ("logprobs", SamplingParams(temperature=0, logprobs=1), [6, 7, 8]),
            ("sampled", SamplingParams(temperature=1.0, seed=3), [12, 13, 14])]
    result = runner.execute(StepPlan(1, [NewRequestData(r, PROMPT, sp, blocks, 0, len(PROMPT))
                                         for r, sp, blocks in rows], [], []))
    # 8 slots for "greedy": one proposal forward fits (position 7); sampled rows propose greedily all the same
    assert result.proposed_draft_ids[0] == greedy_continuation(draft, PROMPT + result.sampled_token_ids[:1], 1)
    assert result.proposed_draft_ids[1] == []  # logprobs (as penalties and grammars: protocol may_draft) get none
    assert result.proposed_draft_ids[2] == greedy_continuation(draft, PROMPT + result.sampled_token_ids[2:], K)
    runner.execute(StepPlan(2, [], [], [r for r, *_ in rows]))


def test_block_copies_are_mirrored(models):
    _, _, runner = models
    cache = runner.draft.runner.cache
    cache.layers[0][5 * BLOCK:6 * BLOCK].assign(cache.layers[0][5 * BLOCK:6 * BLOCK] + 1.0).realize()
    runner.copy_blocks([[5, 20]])
    assert np.array_equal(cache.layers[0][20 * BLOCK:21 * BLOCK].numpy(), cache.layers[0][5 * BLOCK:6 * BLOCK].numpy())


def test_a_draft_of_another_vocabulary_is_refused():
    check_draft_vocab(97, 97, "same")
    with pytest.raises(ValueError, match="must share the target's tokenizer"):
        check_draft_vocab(96, 97, "/models/other.gguf")


def test_the_worker_splits_its_kv_memory_over_both_caches(tmp_path):
    import json
    from tests.helpers.tiny_model import make_tiny_gguf
    from tinyvllm.protocol.engine_config import EngineConfig
    from tinyvllm.protocol.messages import InitWorker
    from tinyvllm.protocol.process_args import WorkerArgs
    from tinyvllm.workers.kv_cache import bytes_per_block
    from tinyvllm.workers.main import build_runner
    target, draft = make_tiny_gguf(tmp_path / "t.gguf"), make_tiny_gguf(tmp_path / "d.gguf", seed=1, n_layers=1)
    spec = json.dumps({"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2})
    engine = EngineConfig.of(num_kv_blocks=0, kv_cache_memory=1 << 20, block_size=16, max_num_seqs=2,
                             max_num_batched_tokens=16, speculative_config=spec, max_model_len=64)
    runner, _ = build_runner(WorkerArgs(EngineConfig.of(model=str(target))), InitWorker(engine))
    per_block = bytes_per_block(runner.model.cfg, 16, "auto") + bytes_per_block(runner.draft.runner.model.cfg, 16, "auto")
    assert runner.cache.num_blocks == runner.draft.runner.cache.num_blocks == (1 << 20) // per_block
    assert runner.draft.k == 2 and runner.draft.runner.model.cfg.n_layers == 1


def test_warming_up_a_bucket_captures_the_drafts_too(models):
    target, draft, _ = models
    runner = make_runner(target, draft)
    assert runner.warm_up_bucket(1) and not runner.warm_up_bucket(1)  # a captured bucket is skipped
    assert runner.forward_jits[1].captured is not None and runner.draft.runner.forward_jits[1].captured is not None
    first = runner.execute(StepPlan(1, [NewRequestData("a", PROMPT, GREEDY, [0, 1, 2], 0, len(PROMPT))], [], []))
    assert first.proposed_draft_ids[0] == greedy_continuation(draft, PROMPT + first.sampled_token_ids, K)
