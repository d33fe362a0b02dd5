"""Smoke test of the transformers reference used by the end-to-end model tests."""
from tests.reference.hf_reference import reference_greedy


def test_reference_greedy_answers_a_simple_question(default_tokenizer):
    tok = default_tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])),
               tok.encode("The numbers go 1, 2, 3,")]
    results = reference_greedy(prompts, n_tokens=8)
    assert [len(r["token_ids"]) for r in results] == [8, 8] and len(results[0]["top2_gap"]) == 8
    assert tok.decode(results[0]["token_ids"]).startswith("The capital of France is Paris")
    assert all(gap >= 0 for r in results for gap in r["top2_gap"])
