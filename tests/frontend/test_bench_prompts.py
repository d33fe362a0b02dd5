"""frontend/cli/bench/random_prompts.py: prompts of exactly the asked token count, the same for the same seed."""
import pytest

from fake_tokenizer import OFFSET, CharTokenizer
from tinyvllm.frontend.cli.bench.random_prompts import allowed_token_ids, random_prompts


class AsciiTokenizer(CharTokenizer):
    """One token per character, ids 0..130: the specials and ASCII (id 0, <pad>, decodes to nothing)."""
    vocab_size = OFFSET + 128


def test_fake_tokenizer_prompts_are_exact_and_deterministic():
    tok = AsciiTokenizer()
    first = random_prompts(tok, 5, 12, seed=3)
    assert random_prompts(tok, 5, 12, seed=3) == first
    assert random_prompts(tok, 5, 12, seed=4) != first
    assert len({p.text for p in first}) == 5
    for p in first:
        assert len(p.text) == 12 and p.token_ids == tok.encode(p.text, add_special_tokens=False)


def test_special_tokens_are_never_drawn():
    allowed = set(allowed_token_ids(AsciiTokenizer()).tolist())
    assert 1 not in allowed and 2 not in allowed and 0 in allowed and len(allowed) == OFFSET + 128 - 2


def test_a_prompt_needs_a_token():
    with pytest.raises(ValueError):
        random_prompts(AsciiTokenizer(), 1, 0)


@pytest.mark.parametrize("length", [1, 2, 5, 64, 300])
def test_real_tokenizer_prompts_round_trip_to_exactly_the_length(length, default_tokenizer):
    tok = default_tokenizer
    prompts = random_prompts(tok, 8, length, seed=[0, 1])
    assert prompts == random_prompts(tok, 8, length, seed=[0, 1])
    special = tok.special_token_ids
    for p in prompts:
        assert tok.encode(p.text, add_special_tokens=False) == p.token_ids and len(p.token_ids) == length
        assert tok.encode(p.text) == p.token_ids  # SmolLM2 adds no BOS: the server sees the same count
        assert not special & set(p.token_ids)
