"""IncrementalDetokenizer: deltas never split a character and always add up to the full decode."""
import random

import pytest

from tinyvllm.frontend.engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello 😀🎉 world! 👨‍👩‍👧 and 🇫🇷🇯🇵",
    "日本語のテキストと中文字符，한국어도 있어요。",
    "Mixed: naïve café — “quotes” … 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝄞 ok",
    "code:\n\tdef f(x):\n\t\treturn x  # ✓\n",
    "<|im_start|>assistant\nSure 🤖<|im_end|>",
]


@pytest.fixture(scope="module")
def tok(default_tokenizer):
    return default_tokenizer


def stream(tok, ids, chunk_sizes, skip_special_tokens=True):
    detok = IncrementalDetokenizer(tok, prompt_token_ids=[1, 2, 3], skip_special_tokens=skip_special_tokens)
    deltas, i = [], 0
    sizes = iter(chunk_sizes)
    while i < len(ids):
        n = next(sizes)
        deltas.append(detok.add(ids[i:i + n]))
        i += n
    return deltas, detok.flush()


def test_texts_split_characters_across_tokens(tok):
    # the byte-level vocabulary spells these characters with several tokens each, which is the hard case
    ids = tok.encode("𝔘𝄞🤖")
    assert any("\ufffd" in tok.decode([i]) for i in ids)


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time(tok, text):
    ids = tok.encode(text)
    deltas, tail = stream(tok, ids, [1] * len(ids))
    assert "".join(deltas) == tok.decode(ids) and tail == ""
    assert not any("\ufffd" in d for d in deltas)
    deltas, tail = stream(tok, ids, [1] * len(ids), skip_special_tokens=False)
    assert "".join(deltas) == text and tail == ""


@pytest.mark.parametrize("seed", range(10))
def test_random_chunk_sizes(tok, seed):
    rng = random.Random(seed)
    text = "".join(rng.sample(TEXTS, 3))
    ids = tok.encode(text)
    deltas, tail = stream(tok, ids, [rng.randint(0, 5) for _ in range(10 * len(ids) + 1)])
    assert "".join(deltas) + tail == tok.decode(ids) and tail == ""
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_token_ids(tok, seed, skip_special_tokens):
    # arbitrary ids make invalid UTF-8 and special tokens: only the final flush may differ from a plain stream
    rng = random.Random(seed)
    ids = [rng.randrange(tok.vocab_size) if rng.random() < 0.7 else rng.randrange(17) for _ in range(60)]
    deltas, tail = stream(tok, ids, [rng.randint(1, 4) for _ in range(len(ids))], skip_special_tokens)
    assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=skip_special_tokens)
    assert not any(d.endswith("\ufffd") for d in deltas)


def test_special_tokens_only_and_empty_adds(tok):
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    assert detok.add([]) == "" and detok.add([2]) == "" and detok.add([0, 1]) == ""
    assert detok.add(tok.encode("ok")) == "ok" and detok.flush() == ""
    assert detok.text == "ok"


def test_flush_emits_an_incomplete_character(tok):
    ids = tok.encode("🤖")
    detok = IncrementalDetokenizer(tok, [])
    assert detok.add(ids[:-1]) == ""  # held back: only part of the emoji's bytes so far
    assert detok.flush() == tok.decode(ids[:-1]) and detok.flush() == ""
