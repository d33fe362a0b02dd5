"""Logprobs in OpenAI's two formats: the formatting itself (including -inf, the chosen token in the completions
top dict, byte-exact `bytes` for split UTF-8 with the real tokenizer), and through the app, streamed and not,
with echo's prompt logprobs and n > 1."""
import math

import pytest

from app_harness import MODEL, REPLY, client_for, parse_sse
from fake_engine import FakeEngine
from fake_tokenizer import CharDetokenizer, CharTokenizer
from tinyvllm.frontend.api import logprobs as lp
from tinyvllm.frontend.api.app import build_app
from tinyvllm.protocol.messages import TokenLogprobs

pytestmark = pytest.mark.anyio
USER_HI = [{"role": "user", "content": "Hi"}]


def fake_entry(token_id: int) -> TokenLogprobs:
    """A made-up but recognisable distribution: the token's logprob depends on it, the top-2 are fixed."""
    return TokenLogprobs(token_id, -(token_id % 7) / 4, [token_id, 100], [-(token_id % 7) / 4, -3.0])


class LogprobsEngine(FakeEngine):
    """FakeEngine whose outputs carry the logprobs the request asked for, as the scheduler sends them."""

    async def generate(self, req_id, prompt_token_ids, sampling, eos_token_ids):
        first = {}
        async for out in super().generate(req_id, prompt_token_ids, sampling, eos_token_ids):
            if sampling.logprobs is not None and out.new_token_ids:
                out.logprobs = [fake_entry(t) for t in out.new_token_ids]
            if sampling.prompt_logprobs is not None and first.setdefault(out.index, True):
                first[out.index] = False
                out.prompt_logprobs = [fake_entry(t) for t in prompt_token_ids[1:]]
            yield out


@pytest.fixture
def served():
    tokenizer = CharTokenizer()
    engine = LogprobsEngine(tokenizer.encode(REPLY, add_special_tokens=False), tokenizer.eos_token_ids[0])
    app = build_app(engine, tokenizer, MODEL, 64, make_detokenizer=CharDetokenizer)
    return client_for(app), tokenizer


def test_chat_content_format():
    tokens = lp.TokenText(CharTokenizer())
    entry = TokenLogprobs(ord("a") + 3, -0.25, [ord("a") + 3, ord("é") + 3, 2], [-0.25, -2.0, -math.inf])
    (item,) = lp.chat_content(tokens, [entry], top_k=3)
    assert item == {"token": "a", "logprob": -0.25, "bytes": [97], "top_logprobs": [
        {"token": "a", "logprob": -0.25, "bytes": [97]}, {"token": "é", "logprob": -2.0, "bytes": [0xC3, 0xA9]},
        {"token": "</s>", "logprob": -9999.0, "bytes": list(b"</s>")}]}
    assert lp.chat_content(tokens, [entry], top_k=0)[0]["top_logprobs"] == []


def test_completion_format_has_the_chosen_token_and_offsets():
    tokens = lp.TokenText(CharTokenizer())
    ids = [ord(c) + 3 for c in "abc"]
    entries = [None, TokenLogprobs(ids[1], -1.5, [ids[0], ids[2]], [-0.5, -1.0]),
               TokenLogprobs(ids[2], -0.5, [ids[2], ids[0]], [-0.5, -0.75])]
    body = lp.completion_logprobs(tokens, ids, entries, top_k=1, text_offset=10)
    assert body == {"tokens": ["a", "b", "c"], "token_logprobs": [None, -1.5, -0.5],
                    "top_logprobs": [None, {"b": -1.5, "a": -0.5}, {"c": -0.5}], "text_offset": [10, 11, 12]}
    assert lp.merge(None, body) == body
    assert lp.merge(body, body)["text_offset"] == [10, 11, 12] * 2


def test_bytes_of_split_characters_are_exact(default_tokenizer):
    tokenizer = default_tokenizer
    tokens = lp.TokenText(tokenizer)
    for text in ("🙂", "你好", " señor"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(bytes(tokens.of(t)[1]) for t in ids) == text.encode()
    eos = tokenizer.eos_token_ids[0]
    assert tokens.of(eos) == ("<|im_end|>", list(b"<|im_end|>"))


async def test_chat_logprobs_non_streamed_and_streamed(served):
    client, tok = served
    body = {"model": MODEL, "messages": USER_HI, "logprobs": True, "top_logprobs": 2, "max_tokens": 5}
    choice = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == list(REPLY[:5])
    expected = [fake_entry(t) for t in tok.encode(REPLY[:5], add_special_tokens=False)]
    assert [c["logprob"] for c in content] == [e.logprob for e in expected]
    assert content[0]["top_logprobs"] == [{"token": "H", "logprob": expected[0].logprob, "bytes": [72]},
                                          {"token": "a", "logprob": -3.0, "bytes": [97]}]
    events = parse_sse((await client.post("/v1/chat/completions", json={**body, "stream": True})).text)
    chunks = [e for e in events[:-1] if e["choices"] and e["choices"][0]["logprobs"]]
    assert [c for e in chunks for c in e["choices"][0]["logprobs"]["content"]] == content
    assert events[1]["choices"][0]["logprobs"] is None or events[0]["choices"][0]["logprobs"] is None  # role chunk


async def test_chat_without_logprobs_has_null(served):
    client, _ = served
    choice = (await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 3})).json()
    assert choice["choices"][0]["logprobs"] is None


async def test_completion_logprobs_with_echo(served):
    client, tok = served
    body = {"prompt": "Yo", "logprobs": 2, "echo": True, "max_tokens": 3}
    choice = (await client.post("/v1/completions", json=body)).json()["choices"][0]
    assert choice["text"] == "Yo" + REPLY[:3]
    got = choice["logprobs"]
    prompt_ids = tok.encode("Yo")  # BOS + 2 characters: BOS decodes to "<s>" as a token
    assert got["tokens"] == ["<s>", "Y", "o", "H", "e", "l"]
    assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
    assert got["token_logprobs"][1:3] == [fake_entry(t).logprob for t in prompt_ids[1:]]
    assert got["text_offset"] == [0, 3, 4, 5, 6, 7]  # the tokens' own texts add up, "<s>" included
    assert got["top_logprobs"][3] == {"H": fake_entry(ord("H") + 3).logprob, "a": -3.0}  # chosen first, then top-2
    events = parse_sse((await client.post("/v1/completions", json={**body, "stream": True})).text)
    streamed = None
    for e in events[:-1]:
        streamed = lp.merge(streamed, e["choices"][0]["logprobs"])
    assert streamed == got and "".join(e["choices"][0]["text"] for e in events[:-1]) == choice["text"]


async def test_echo_without_logprobs_and_n2(served):
    client, _ = served
    body = {"prompt": "Yo", "echo": True, "max_tokens": 2, "n": 2, "logprobs": 0}
    choices = (await client.post("/v1/completions", json=body)).json()["choices"]
    assert [c["text"] for c in choices] == ["YoHe", "YoHe"]
    for c in choices:
        assert len(c["logprobs"]["tokens"]) == 5 and all(len(t) == 1 for t in c["logprobs"]["top_logprobs"][1:])
    plain = (await client.post("/v1/completions", json={"prompt": "Yo", "echo": True, "max_tokens": 2})).json()
    assert plain["choices"][0]["text"] == "YoHe" and plain["choices"][0]["logprobs"] is None
