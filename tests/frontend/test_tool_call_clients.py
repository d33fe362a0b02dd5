"""Tool calls through the official `openai` and `ollama` clients, unmodified, against the app and the fake engine
scripted to answer in the Hermes format: tool_choice "auto" parses the model's own calls (streamed and not), "none"
leaves the text alone, and a second turn's calls and tool results reach the prompt."""
import json

import httpx
import ollama
import openai
import pytest

from app_harness import MODEL
from fake_engine import FakeEngine
from fake_tokenizer import CharDetokenizer, CharTokenizer
from tinyvllm.frontend.api.app import build_app

pytestmark = pytest.mark.anyio

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ASK = [{"role": "user", "content": "Weather in Paris?"}]


class ToolsTemplateTokenizer(CharTokenizer):
    """As a model whose template renders tools itself (Llama 3.1's tests `'tool_calls' in message`)."""
    chat_template = "{% if tools %}...{% endif %}"

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        assert all(m.get("tool_calls", [None]) for m in messages), f"a message with an empty tool_calls: {messages}"
        self.seen = messages, extra
        return super().apply_chat_template([m for m in messages if m["role"] != "tool"], add_generation_prompt)


def serve(reply: str, tokenizer: CharTokenizer | None = None):
    tokenizer = tokenizer or CharTokenizer()
    engine = FakeEngine(tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_ids[0],
                        max_model_len=4096)
    app = build_app(engine, tokenizer, MODEL, 4096, make_detokenizer=CharDetokenizer)
    transport = httpx.ASGITransport(app)
    return (openai.AsyncOpenAI(base_url="http://test/v1", api_key="x",
                               http_client=httpx.AsyncClient(transport=transport)),
            ollama.AsyncClient(host="http://test", transport=transport), engine, tokenizer)


def prompt_of(engine, tokenizer) -> str:
    return tokenizer.decode(next(iter(engine.requests.values())).prompt_token_ids)


async def test_auto_parses_the_models_calls_streamed_and_not():
    client, _, engine, tokenizer = serve("Let me check.\n" + CALL)
    reply = await client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert "<tools>" in prompt_of(engine, tokenizer) and "get_weather" in prompt_of(engine, tokenizer)

    content, calls, finish = "", {}, None
    async for chunk in await client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        assert "<tool" not in content, "a call's text must not stream as content"
        for part in delta.tool_calls or []:
            calls.setdefault(part.index, {"name": "", "arguments": ""})
            calls[part.index]["name"] += part.function.name or ""
            calls[part.index]["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Let me check." and finish == "tool_calls"
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Paris"}


async def test_text_that_only_looks_like_a_call_streams_whole():
    text = "a <tool b <tool_call>{not json}</tool_call>"
    client, _, _, _ = serve(text)
    pieces = [c.choices[0].delta.content or "" async for c in await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], stream=True)]
    assert "".join(pieces) == text
    reply = await client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none")
    assert reply.choices[0].message.content == text and not reply.choices[0].message.tool_calls


async def test_none_leaves_calls_as_text_and_required_sends_a_grammar():
    client, _, engine, tokenizer = serve(CALL)
    reply = await client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none")
    assert reply.choices[0].message.content == CALL and reply.choices[0].finish_reason == "stop"
    assert "<tools>" not in prompt_of(engine, tokenizer)
    engine.requests.clear()
    reply = await client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required")
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert "get_weather" in next(iter(engine.requests.values())).sampling.grammar


async def test_a_second_turn_renders_the_call_and_its_result():
    client, _, engine, tokenizer = serve("It is sunny.")
    turn = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    reply = await client.chat.completions.create(model=MODEL, messages=turn, tools=[WEATHER])
    assert reply.choices[0].message.content == "It is sunny." and reply.choices[0].finish_reason == "stop"
    prompt = prompt_of(engine, tokenizer)
    assert CALL in prompt and "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    with pytest.raises(openai.BadRequestError, match="arguments must be a JSON object"):
        turn[1]["tool_calls"][0]["function"]["arguments"] = "{not json"
        await client.chat.completions.create(model=MODEL, messages=turn, tools=[WEATHER])


@pytest.mark.parametrize("extra,fragment", [
    ({"tool_choice": "required"}, "needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "names no function"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
      "tool_choice": "required"}, "tools"),
])
async def test_bad_tool_requests_are_400s(extra, fragment):
    client, _, engine, _ = serve(CALL)
    with pytest.raises(openai.BadRequestError, match=fragment):
        await client.chat.completions.create(model=MODEL, messages=ASK, **extra)
    assert not engine.requests


async def test_the_ollama_client_gets_message_tool_calls():
    _, client, engine, tokenizer = serve("Checking. " + CALL)
    reply = await client.chat(model=MODEL, messages=ASK, tools=[WEATHER])
    assert reply.message.content == "Checking." and reply.done
    [call] = reply.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    pieces = [p async for p in await client.chat(model=MODEL, messages=ASK, tools=[WEATHER], stream=True)]
    calls = [c for p in pieces for c in p.message.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert "".join(p.message.content for p in pieces) == "Checking."
    engine.requests.clear()
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    await client.chat(model=MODEL, messages=history, tools=[WEATHER])
    assert "<tool_response>\nsunny\n</tool_response>" in prompt_of(engine, tokenizer)


async def test_a_template_that_knows_tools_gets_them_and_no_empty_tool_calls():
    openai_client, ollama_client, _, tokenizer = serve("Hi", ToolsTemplateTokenizer())
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    await ollama_client.chat(model=MODEL, messages=history, tools=[WEATHER])
    messages, extra = tokenizer.seen
    assert extra["tools"][0]["function"]["name"] == "get_weather" and "tool_calls" not in messages[0]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[2] == {"role": "tool", "content": "sunny", "name": "get_weather"}
    await openai_client.chat.completions.create(model=MODEL, messages=ASK + [{"role": "assistant", "content": "Hi"}])
    messages, extra = tokenizer.seen
    assert extra == {} and messages[1] == {"role": "assistant", "content": "Hi"}
