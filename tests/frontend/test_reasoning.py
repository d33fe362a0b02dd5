"""Reasoning replies (frontend/api/reasoning.py): the parsers split thinking from the answer however the text is
chunked, follow the chat template when not named, and /v1/chat/completions returns the thinking as
reasoning_content and reasoning, whole and streamed, with chat_template_kwargs reaching the template."""
import itertools
import json

import pytest

from app_harness import MODEL, client_for, parse_sse
from fake_engine import FakeEngine
from fake_tokenizer import CharDetokenizer, CharTokenizer
from tinyvllm.frontend.api.app import build_app
from tinyvllm.frontend.api.reasoning import ReasoningText, reasoning_format

QWEN3, R1 = reasoning_format("qwen3", None), reasoning_format("deepseek_r1", None)
CASES = [  # format, prompt opened the block, reply -> (thinking, answer)
    (QWEN3, False, "<think>\nplan it</think>\n\nThe answer", ("\nplan it", "The answer")),
    (QWEN3, False, "\n<think>a < b</think>x < y", ("a < b", "x < y")),
    (QWEN3, False, "Just an answer", ("", "Just an answer")),
    (QWEN3, False, "An answer <think>not at the start</think>", ("", "An answer <think>not at the start</think>")),
    (QWEN3, False, "<thin", ("", "<thin")),  # a reply that ends inside what looked like the tag: text
    (QWEN3, True, "plan</think>Answer", ("plan", "Answer")),
    (QWEN3, False, "<think>never closed </thi", ("never closed </thi", "")),
    (R1, False, "plan without an opening tag</think>\n\nAnswer", ("plan without an opening tag", "Answer")),
    (R1, False, "<think>plan</think>Answer", ("plan", "Answer")),
    (R1, False, "thinking to the end", ("thinking to the end", "")),
    (R1, True, "</think>Answer at once", ("", "Answer at once")),
]


def split(fmt, opened: bool, chunks: list[str]) -> tuple[str, str]:
    splitter, thinking, answer = ReasoningText(fmt, opened), [], []
    for chunk in chunks:
        t, a = splitter.feed(chunk)
        thinking.append(t), answer.append(a)
    t, a = splitter.finish()
    return "".join(thinking + [t]), "".join(answer + [a])


@pytest.mark.parametrize("fmt,opened,reply,expected", CASES)
def test_every_chunking_gives_the_same_split(fmt, opened, reply, expected):
    assert split(fmt, opened, [reply]) == expected
    assert split(fmt, opened, list(reply)) == expected  # a character at a time
    for i, j in itertools.combinations(range(len(reply) + 1), 2):  # every tag cut anywhere, in three pieces
        assert split(fmt, opened, [reply[:i], reply[i:j], reply[j:]]) == expected, (i, j)


def test_nothing_is_shown_before_it_is_known_to_be_thinking_or_answer():
    splitter = ReasoningText(QWEN3, opened=False)
    assert splitter.feed("\n<th") == ("", "")
    assert splitter.feed("ink>plan</") == ("plan", "")
    assert splitter.feed("think>") == ("", "")
    assert splitter.feed("\n\nAnswer") == ("", "Answer")


def test_the_parser_follows_the_chat_template_unless_named():
    assert reasoning_format(None, "{% if enable_thinking is false %}<think>\n\n</think>{% endif %}").name == "qwen3"
    implied = reasoning_format(None, "{{ '<｜Assistant｜><think>\n' }}")
    assert implied.name == "deepseek_r1" and not implied.thinks_first
    # a template that names <think> only to drop past thinking, for a model that answers at once: all content
    assert split(implied, False, ["Hello world"]) == ("", "Hello world")
    assert split(implied, True, ["plan</think>Answer"]) == ("plan", "Answer")  # its prompt opened the block
    assert reasoning_format("deepseek_r1", None).thinks_first
    assert reasoning_format(None, "{{ messages }}") is None and reasoning_format(None, None) is None
    assert reasoning_format("none", "<think>") is None
    with pytest.raises(ValueError, match="unknown reasoning parser 'o1'"):
        reasoning_format("o1", None)


# ---- through the app ------------------------------------------------------------------------------------------

class ThinkingTemplateTokenizer(CharTokenizer):
    """Qwen3's template in miniature: enable_thinking false closes an empty think block in the prompt; `opens`
    ends the prompt inside one (DeepSeek-R1's newer templates); reasoning_effort is written into the prompt."""
    chat_template = "{% if enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"

    def __init__(self, opens: bool = False):
        self.opens = opens

    def apply_chat_template(self, messages, add_generation_prompt=True, enable_thinking=True, reasoning_effort=None,
                            **extra) -> str:
        prompt = super().apply_chat_template(messages, add_generation_prompt)
        prompt += f"<effort {reasoning_effort}>" if reasoning_effort else ""
        return prompt + ("<think>\n" if self.opens else "" if enable_thinking else "<think>\n\n</think>\n\n")


def served_app(reply: str, opens: bool = False):
    tokenizer = ThinkingTemplateTokenizer(opens)
    engine = FakeEngine(tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_ids[0],
                        max_model_len=256)
    return build_app(engine, tokenizer, MODEL, 256, make_detokenizer=CharDetokenizer), engine


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Why?"}], "max_tokens": 100}


@pytest.mark.anyio
async def test_a_chat_reply_gives_its_thinking_apart_whole_and_streamed():
    app, _ = served_app("<think>Let me see.</think>\n\nBecause.")
    async with client_for(app) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        message = r.json()["choices"][0]["message"]
        assert (message["reasoning_content"], message["reasoning"], message["content"]) == \
            ("Let me see.", "Let me see.", "Because.")
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        chunks = parse_sse(r.text)[:-1]
        deltas = [c["choices"][0]["delta"] for c in chunks]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "Let me see."
        assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
        assert "".join(d.get("content", "") for d in deltas) == "Because."
        assert not any("<" in d.get("content", "") + d.get("reasoning_content", "") for d in deltas)  # no tag leaks
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.anyio
async def test_thinking_switched_off_leaves_all_of_the_reply_content():
    app, engine = served_app("Because.")
    async with client_for(app) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "chat_template_kwargs": {"enable_thinking": False}})
        message = r.json()["choices"][0]["message"]
        assert message["content"] == "Because." and "reasoning_content" not in message
    tokenizer = ThinkingTemplateTokenizer()
    assert tokenizer.decode(list(engine.requests.values())[-1].prompt_token_ids).endswith("<assistant><think>\n\n</think>\n\n")


@pytest.mark.anyio
async def test_a_prompt_that_opens_the_block_makes_the_reply_thinking_until_it_closes():
    app, engine = served_app("No tag here, still thinking</think>Done.", opens=True)
    async with client_for(app) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "reasoning_effort": "low"})
        message = r.json()["choices"][0]["message"]
        assert (message["reasoning_content"], message["content"]) == ("No tag here, still thinking", "Done.")
    assert "<effort low>" in ThinkingTemplateTokenizer().decode(list(engine.requests.values())[-1].prompt_token_ids)


@pytest.mark.anyio
async def test_template_variables_the_server_sets_are_refused_and_the_flag_none_keeps_the_tags():
    app, _ = served_app("<think>x</think>y")
    async with client_for(app) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "chat_template_kwargs": {"messages": []}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"
        r = await client.post("/v1/chat/completions", json={**CHAT, "chat_template_kwargs": "yes"})
        assert r.status_code == 400 and "chat_template_kwargs" in r.json()["error"]["message"]
        r = await client.post("/v1/chat/completions", json={**CHAT, "reasoning_effort": "extreme"})
        assert r.status_code == 400
    tokenizer = ThinkingTemplateTokenizer()
    engine = FakeEngine(tokenizer.encode("<think>x</think>y", add_special_tokens=False), 2, max_model_len=256)
    plain = build_app(engine, tokenizer, MODEL, 256, make_detokenizer=CharDetokenizer, reasoning_parser="none")
    async with client_for(plain) as client:
        message = (await client.post("/v1/chat/completions", json=CHAT)).json()["choices"][0]["message"]
        assert message["content"] == "<think>x</think>y" and "reasoning_content" not in message


# ---- Ollama's think ----------------------------------------------------------------------------------------------

@pytest.mark.anyio
async def test_ollama_think_gives_message_thinking_and_turns_thinking_off_or_sets_its_effort():
    app, engine = served_app("<think>Let me see.</think>\n\nBecause.")
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Why?"}], "stream": False}
    async with client_for(app) as client:
        message = (await client.post("/api/chat", json={**chat, "think": True})).json()["message"]
        assert (message["thinking"], message["content"]) == ("Let me see.", "Because.")
        r = await client.post("/api/chat", json={**chat, "think": "high", "stream": True})
        lines = [json.loads(line) for line in r.text.splitlines()]
        assert "".join(c["message"].get("thinking", "") for c in lines) == "Let me see."
        assert "".join(c["message"]["content"] for c in lines) == "Because." and lines[-1]["done"]
        prompt = ThinkingTemplateTokenizer().decode(list(engine.requests.values())[-1].prompt_token_ids)
        assert prompt.endswith("<assistant><effort high>")
        reply = (await client.post("/api/generate", json={"model": MODEL, "prompt": "Why?", "stream": False,
                                                          "think": False})).json()
        assert (reply["thinking"], reply["response"]) == ("Let me see.", "Because.")  # (this fake thinks regardless)
        prompt = ThinkingTemplateTokenizer().decode(list(engine.requests.values())[-1].prompt_token_ids)
        assert prompt.endswith("<think>\n\n</think>\n\n")
        r = await client.post("/api/chat", json={**chat, "think": "very"})
        assert r.status_code == 400 and "'think' must be" in r.json()["error"]


# ---- the thinking budget's refusals (tests/e2e/test_reasoning_model.py serves one that holds) ---------------------

@pytest.mark.anyio
async def test_a_thinking_budget_that_cannot_hold_is_a_400():
    plain_tokenizer = CharTokenizer()
    engine = FakeEngine(plain_tokenizer.encode("Hi", add_special_tokens=False), 2, max_model_len=256)
    plain = build_app(engine, plain_tokenizer, MODEL, 256, make_detokenizer=CharDetokenizer)
    thinking, _ = served_app("<think>x</think>y")  # its tags are several (character) tokens each
    for app, body, words in [
            (plain, {**CHAT, "thinking_token_budget": 8}, "needs a reasoning model"),
            (thinking, {**CHAT, "thinking_token_budget": 8}, "single tokens"),
            (thinking, {**CHAT, "thinking_token_budget": 2**31}, "thinking_token_budget"),
            (thinking, {**CHAT, "thinking_token_budget": -1}, "thinking_token_budget"),
            (plain, {**CHAT, "thinking_token_budget": 8, "use_beam_search": True, "n": 2}, "use_beam_search")]:
        async with client_for(app) as client:
            r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == "thinking_token_budget"
    async with client_for(thinking) as client:  # no budget: the thinking is split as ever
        r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.json()["choices"][0]["message"]["reasoning_content"] == "x"
