"""Tokenizer (built from GGUF metadata) against Hugging Face transformers' tokenizer for the same GGUF."""
import json

import pytest
from tokenizers import pre_tokenizers

from tinyvllm.protocol.tokenizer import Tokenizer
from tinyvllm.protocol.gguf_file import GGUFFile

TEXTS = [
    "Hello world!", "Hello, world! How are you today?", "  leading spaces", "trailing spaces   ",
    "x  y   z    w", "\n\n\n", "\t\ttabs\tand\r\nCRLF\r\n", "", " ", "a",
    "12345", "3.14159 and 1,000,000", "phone: 555-0123", "I'm sure you'll agree they've gone",
    "naïve café résumé Ærøskøbing", "😀🎉 emoji 👨‍👩‍👧 family 🇫🇷 flag", "🤖" * 5,
    "日本語のテキストです。", "中文字符和标点，测试", "한국어 텍스트", "Ελληνικά и кириллица", "مرحبا بالعالم",
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { a[i] = i; }",
    '{"key": [1, 2, {"nested": null}]}', "<|im_start|>user\nhi<|im_end|>\n", "a<|endoftext|>b<|im_end|>c",
    "<|im_start", "almost <|im_end |> special", "١٢٣ ²³ ½ Ⅻ １２３", "zero\u200bwidth\u00a0nbsp", "\x00\x01 control",
]


@pytest.fixture(scope="module")
def tok(default_model_path):
    return Tokenizer.from_model_path(default_model_path)


@pytest.fixture(scope="module")
def hf_tok(default_model_path):
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(str(default_model_path.parent), gguf_file=default_model_path.name)
    # transformers ignores tokenizer.ggml.pre == "smollm"; put back SmolLM2's own pre-tokenizer (from its
    # tokenizer.json on the Hub: digits isolated, then byte-level), which llama.cpp's "smollm" mirrors.
    ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return ref


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(tok, hf_tok, text):
    ids = tok.encode(text)
    assert ids == hf_tok.encode(text, add_special_tokens=True)
    assert tok.decode(ids) == hf_tok.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids, skip_special_tokens=False) == hf_tok.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_and_ids(tok):
    assert tok.encode("<|im_start|>user<|im_end|>") == [1, 4093, 2]
    assert tok.decode([1, 4093, 2]) == "user"
    assert tok.eos_token_ids == [2] and tok.bos_token_id == 1 and tok.vocab_size == 49152
    assert tok.id_to_token(2) == "<|im_end|>" and tok.id_to_token(tok.token_to_id("Ġhello")) == "Ġhello"
    assert tok.encode("Hi") == tok.encode("Hi", add_special_tokens=False)  # SmolLM2 adds no BOS
    assert all(len(tok.decode([i], skip_special_tokens=False)) == 1 for i in tok.encode("987654"))


def test_bos_added_when_metadata_says_so(default_model_path):
    md = dict(GGUFFile(default_model_path).metadata, **{"tokenizer.ggml.add_bos_token": True,
                                               "tokenizer.ggml.eot_token_id": 0})
    tok = Tokenizer.from_gguf_metadata(md)
    assert tok.encode("Hi") == [1] + tok.encode("Hi", add_special_tokens=False)
    assert tok.eos_token_ids == [2, 0]


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "日本語で? 😀"}],
    [{"role": "user", "content": "line1\n  line2\n"}, {"role": "assistant", "content": ""}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tok, hf_tok, messages, add_generation_prompt):
    ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert ours == hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def test_chat_template_errors_become_value_errors(tok):
    with pytest.raises(ValueError, match="chat template"):
        tok.apply_chat_template([{"role": "user"}])  # no content: template adds str + undefined
    custom = Tokenizer(tok.hf, bos_token_id=1, eos_token_ids=[2], add_bos=False,
                       chat_template="{{ raise_exception('only user turns, please') }}")
    with pytest.raises(ValueError, match="only user turns, please"):
        custom.apply_chat_template([{"role": "user", "content": "x"}])
    broken = Tokenizer(tok.hf, bos_token_id=1, eos_token_ids=[2], add_bos=False, chat_template="{% if %}")
    with pytest.raises(ValueError, match="chat template"):
        broken.apply_chat_template([])
    no_template = Tokenizer(tok.hf, bos_token_id=1, eos_token_ids=[2], add_bos=False, chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        no_template.apply_chat_template([])


def test_template_helpers_and_sandbox(tok):
    t = Tokenizer(tok.hf, bos_token_id=1, eos_token_ids=[2], add_bos=False, chat_template=(
        "{{ bos_token }}{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ eos_token }}"))
    assert t.apply_chat_template([{"role": "user", "content": "é"}]) == '<|im_start|>{"role": "user", "content": "é"}\n<|im_end|>'
    sneaky = Tokenizer(tok.hf, bos_token_id=1, eos_token_ids=[2], add_bos=False,
                       chat_template="{{ messages.append(1) }}")  # the immutable sandbox forbids mutation
    with pytest.raises(ValueError):
        sneaky.apply_chat_template([])


def test_hf_folder_tokenizer(tmp_path, tok, hf_tok):
    hf_tok.save_pretrained(tmp_path)  # tokenizer.json + tokenizer_config.json + chat_template.jinja
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 0]}))
    from_folder = Tokenizer.from_model_path(tmp_path)
    assert from_folder.eos_token_ids == [2, 0] and from_folder.bos_token_id == 1
    for text in TEXTS:
        assert from_folder.encode(text) == tok.encode(text)
    assert from_folder.apply_chat_template(CONVERSATIONS[1]) == tok.apply_chat_template(CONVERSATIONS[1])
