"""Speculative decoding in the scheduler (n-gram drafts), with the fake worker verifying them: the outputs equal those
without speculation, token for token; rejected drafts are rolled back; a stop inside the accepted tokens ends the
request there; the metrics count drafts and accepted tokens."""
import json
import pytest

from fake_worker import make_request, make_scheduler, run_to_completion, step, tokens_of
from tinyvllm.protocol.messages import FinishReason
from tinyvllm.protocol.speculative_config import SpeculativeConfig, parse_speculative_config
from tinyvllm.scheduler.spec_decode import NgramProposer

NGRAM = SpeculativeConfig("ngram", num_speculative_tokens=3, prompt_lookup_max=4, prompt_lookup_min=2)
PATTERN = [10, 11, 12, 13]


def cyclic(req_id: str, position: int) -> int:
    """A "model" that continues PATTERN: every draft the n-gram lookup proposes is right."""
    return PATTERN[position % 4]


def cyclic_with_surprises(req_id: str, position: int) -> int:
    """Mostly PATTERN, but every 7th token breaks it: some drafts are rejected."""
    return 99 if position % 7 == 0 else PATTERN[position % 4]


def run(token_fn, speculative, reqs, **kw):
    sched, worker = make_scheduler(token_fn=token_fn, speculative=speculative, **kw)
    for req in reqs:
        sched.add_request(req)
    outputs = run_to_completion(sched, worker)
    kv = sched.kv_cache_manager
    assert kv.num_free_blocks == kv.num_total_blocks
    return sched, worker, {req_id: (tokens_of(outs), outs[-1].finish_reason) for req_id, outs in outputs.items()}


def requests(max_tokens=30):
    return [make_request("a", 0, max_tokens=max_tokens, prompt=PATTERN * 3),
            make_request("b", 0, max_tokens=max_tokens, prompt=[7, 8] + PATTERN * 2 + [5]),
            make_request("c", 40, max_tokens=max_tokens)]  # a long prompt, chunked beside the decodes


@pytest.mark.parametrize("token_fn", [cyclic, cyclic_with_surprises])
def test_outputs_equal_those_without_speculation(token_fn):
    _, plain_worker, plain = run(token_fn, None, requests(), max_num_batched_tokens=16)
    sched, worker, spec = run(token_fn, NGRAM, requests(), max_num_batched_tokens=16)
    assert spec == plain
    s = sched.stats()
    assert s.spec_num_drafts > 0 and 0 < s.spec_num_accepted_tokens <= s.spec_num_draft_tokens
    assert sum(s.spec_accepted_per_pos) == s.spec_num_accepted_tokens
    assert s.spec_accepted_per_pos == sorted(s.spec_accepted_per_pos, reverse=True)  # position i+1 needs i accepted
    assert len(worker.num_scheduled_per_step) < len(plain_worker.num_scheduled_per_step)  # fewer steps
    if token_fn is cyclic_with_surprises:
        assert s.spec_num_accepted_tokens < s.spec_num_draft_tokens  # some were rejected and rolled back


def test_partial_acceptance_advances_by_the_accepted_drafts_only():
    sched, worker = make_scheduler(token_fn=cyclic_with_surprises, speculative=NGRAM, block_size=2)
    sched.add_request(make_request("a", 0, max_tokens=40, prompt=PATTERN * 3))  # positions 0..11
    step(sched, worker)  # the prompt: samples position 12 (10), no drafts yet
    req = sched.requests["a"]
    plan, outs = step(sched, worker)  # the last token (10) and drafts 11 12 13 at positions 13..15; 14 is a 99
    (cached,) = plan.cached_reqs
    assert cached.draft_token_ids == [11, 12, 13] and cached.num_scheduled_tokens == 4
    assert outs["a"].new_token_ids == [11, 99]  # draft 11 accepted, then the model's own token
    assert req.num_computed_tokens == 14 and req.num_tokens == 15  # drafts 12 and 13 rolled back
    assert len(req.block_ids) == 8  # the blocks of the rejected positions stay for the next tokens


def test_a_stop_inside_the_accepted_drafts_ends_the_request_there():
    reqs = [make_request("a", 0, max_tokens=20, prompt=PATTERN * 3, stop_token_ids=[12])]
    sched, worker, out = run(cyclic, NGRAM, reqs)
    assert out["a"] == ([10, 11, 12], FinishReason.STOP)  # 13 and the bonus token, accepted too, are dropped
    assert sched.stats().spec_num_accepted_tokens == 3


def test_max_tokens_and_max_model_len_cap_the_drafts():
    for reqs, kw in (([make_request("a", 0, max_tokens=6, prompt=PATTERN * 3)], {}),
                     ([make_request("a", 0, max_tokens=50, prompt=PATTERN * 3)], {"max_model_len": 17})):
        sched, worker, out = run(cyclic, NGRAM, reqs, **kw)
        assert out["a"][1] == FinishReason.LENGTH and len(out["a"][0]) == (6 if not kw else 5)
        assert worker.num_computed_by_req["a"] == 12 + len(out["a"][0]) - 1  # no draft past the last token


def test_requests_with_penalties_logprobs_or_a_grammar_get_no_drafts():
    reqs = [make_request("p", 0, max_tokens=10, prompt=PATTERN * 3, repetition_penalty=1.2),
            make_request("l", 0, max_tokens=10, prompt=PATTERN * 3, logprobs=1),
            make_request("g", 0, max_tokens=10, prompt=PATTERN * 3, grammar='start: "a"+')]
    sched, _, _ = run(cyclic, NGRAM, reqs)
    assert sched.stats().spec_num_drafts == 0


def test_ngram_proposer_takes_the_longest_suffix_seen_before():
    proposer = NgramProposer(min_n=2, max_n=3)
    assert proposer.lookup([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 2) == [9, 2]  # [1 2 3] at 0 wins over [2 3] at 4
    assert proposer.lookup([2, 3, 8, 2, 3, 9, 2, 3], 2) == [9, 2]  # the latest occurrence
    assert proposer.lookup([1, 2, 3, 4, 5], 3) == []
    assert proposer.lookup([5, 6, 7, 5, 6], 5) == [7, 5, 6]


def test_speculative_config_spelled_as_vllm():
    config = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}')
    assert (config.num_speculative_tokens, config.prompt_lookup_max, config.prompt_lookup_min) == (5, 3, 2)
    assert parse_speculative_config(None) is None
    with pytest.raises(ValueError, match="'eagle' is not supported; supported: ngram, draft_model"):
        parse_speculative_config('{"method": "eagle", "num_speculative_tokens": 2}')
    with pytest.raises(ValueError, match="unknown field"):
        parse_speculative_config('{"method": "ngram", "draft_tensor_parallel": 2}')
    draft = parse_speculative_config({"method": "draft_model", "model": "/m/draft.gguf", "num_speculative_tokens": 4})
    assert (draft.method, draft.model, draft.num_speculative_tokens) == ("draft_model", "/m/draft.gguf", 4)
    for wrong in ({"method": "draft_model"}, {"method": "ngram", "model": "/m/draft.gguf"}):
        with pytest.raises(ValueError, match='"draft_model" needs a "model"'):
            parse_speculative_config(wrong)


def test_a_draft_model_of_another_vocabulary_is_refused_at_start_up(tmp_path):
    from tinyvllm.protocol.model_config import read_model_config
    from tinyvllm.protocol.model_path import resolve_model_path
    from tinyvllm.protocol.speculative_config import resolve_draft_model
    target = read_model_config(resolve_model_path(None))
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000, "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "max_position_embeddings": 512}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_text("{}")
    from tinyvllm.frontend.engine.launcher import EngineProcesses
    from tinyvllm.protocol.engine_config import EngineConfig
    with pytest.raises(ValueError, match="vocabulary of 1000 tokens, the target 49152: a draft model must share"):
        EngineProcesses(EngineConfig.of(speculative_config={"method": "draft_model", "model": str(tmp_path)}))
    same = resolve_draft_model(parse_speculative_config({"method": "draft_model", "model": "default"}), target)
    assert same.model == str(resolve_model_path(None))


def test_draft_model_proposals_are_kept_for_the_tokens_they_follow_and_hold_lookahead_slots():
    from tinyvllm.scheduler.spec_decode import DraftModelProposer, SpecDecode
    spec = SpecDecode(SpeculativeConfig("draft_model", num_speculative_tokens=3, model="/m/draft.gguf"))
    req = make_request("a", 0, max_tokens=10, prompt=PATTERN)
    spec.keep_proposals(req, [[7, 8, 9]], 0)
    assert DraftModelProposer().propose(req, 2) == [7, 8]
    req.output_token_ids.append(7)  # the proposals follow other tokens now
    assert DraftModelProposer().propose(req, 2) == []
    assert spec.slots_for(req, 20, max_len=64) == 23 and spec.slots_for(req, 20, max_len=22) == 21
    assert spec.slots_for(req, 20, max_len=21) == 20  # never fewer than the step computes
    assert SpecDecode(NGRAM).slots_for(req, 20, max_len=64) == 20
    penalised = make_request("p", 0, max_tokens=10, prompt=PATTERN, presence_penalty=1.0)
    assert spec.slots_for(penalised, 20, max_len=64) == 20


def test_the_scheduler_process_plans_speculation_without_async_scheduling():
    from tinyvllm.protocol.engine_config import EngineConfig
    from tinyvllm.protocol.process_args import SchedulerArgs
    from tinyvllm.scheduler.main import scheduler_config
    args = SchedulerArgs(EngineConfig.of(block_size=4, max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=64,
                                         async_scheduling=True,
                                         speculative_config='{"method": "ngram", "num_speculative_tokens": 3}',
                                         max_model_len=128))
    config = scheduler_config(args, 64)
    assert config.speculative is not None and not config.async_scheduling
    assert config.max_steps_in_flight == 1  # drafts are planned between steps


def test_draft_model_proposals_from_the_worker_are_verified_next_step_with_lookahead_slots_held():
    """A fake draft model: the worker proposes the true next tokens but the third (always wrong); outputs equal those
    without speculation, and a request that may speculate always holds the slots its proposals' forwards write."""
    draft = SpeculativeConfig("draft_model", num_speculative_tokens=3, model="/m/draft.gguf")
    reqs = lambda: requests() + [make_request("p", 0, max_tokens=30, prompt=PATTERN * 2, presence_penalty=1.0)]
    sizes = dict(max_num_batched_tokens=32, block_size=2, num_blocks=128)
    plain = run(cyclic_with_surprises, None, reqs(), **sizes)[2]
    sched, worker = make_scheduler(token_fn=cyclic_with_surprises, speculative=draft, **sizes)
    execute, max_len = worker.execute, sched.max_len

    def proposing(plan):  # the fake worker checks the lookahead slots; its proposals are replaced
        result, result.proposed_draft_ids = execute(plan), []
        for row, req_id in enumerate(result.req_ids):
            req = sched.requests[req_id]
            newest = req.num_tokens + (len(result.accepted_draft_ids[row]) if result.accepted_draft_ids else 0)
            if req_id != "p":  # the proposals' forwards write positions newest .. newest + 2
                assert len(req.block_ids) * 2 >= min(newest + 3, max_len - 1), (req_id, newest, req.block_ids)
            result.proposed_draft_ids.append([cyclic_with_surprises(req_id, newest + 1 + j) if j < 2 else 0
                                              for j in range(3)])
        return result

    worker.execute = proposing
    for req in reqs():
        sched.add_request(req)
    outputs = run_to_completion(sched, worker)
    assert {r: (tokens_of(outs), outs[-1].finish_reason) for r, outs in outputs.items()} == plain
    s = sched.stats()
    assert s.spec_num_drafts > 0 and 0 < s.spec_num_accepted_tokens < s.spec_num_draft_tokens
    assert s.spec_accepted_per_pos[2] == 0 and s.spec_accepted_per_pos[0] > 0  # the third is always wrong
