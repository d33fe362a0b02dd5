"""Tool calls in the Hermes format: the tools checked (a 400 names the problem), the grammar that forces calls
accepts exactly the calls whose arguments validate against the function's schema, and finished text parses back."""
import json

import pytest

from tinyvllm.frontend.api.structured_output import GrammarInvalid
from tinyvllm.frontend.api.tool_calls import (NO_TOOLS, chat_tools, check_tools, chosen_functions, forced_grammar,
                                          parse_tool_calls, template_messages, tool_preamble)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                 "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def tokenizer():
    from tinyvllm.protocol.tokenizer import Tokenizer
    from tinyvllm.workers.sampling_masks import tokenizer_for_model
    return Tokenizer.from_model_path(None), tokenizer_for_model(None, 49152)


def accepts(tokenizer, grammar: str, text: str) -> bool:
    from llguidance import LLMatcher
    tok, ll_tok = tokenizer
    matcher = LLMatcher(ll_tok, grammar, log_level=0)
    tokens = tok.encode(text)
    return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) and \
        matcher.is_accepting()


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>\n"


def test_the_forced_grammar_takes_only_calls_that_validate(tokenizer):
    functions = check_tools([WEATHER, TIME])
    grammar = forced_grammar(chosen_functions(functions, "required"))
    assert accepts(tokenizer, grammar, call("get_weather", {"city": "Paris", "unit": "celsius"}))
    assert accepts(tokenizer, grammar, call("get_weather", {"city": "Oslo"}) + call("get_time", {}))
    assert not accepts(tokenizer, grammar, call("get_weather", {"unit": "celsius"}))  # city is required
    assert not accepts(tokenizer, grammar, call("get_weather", {"city": "Rome", "unit": "kelvin"}))
    assert not accepts(tokenizer, grammar, call("send_mail", {}))
    assert not accepts(tokenizer, grammar, "The weather is fine.")
    named = forced_grammar(chosen_functions(functions, {"type": "function", "function": {"name": "get_time"}}))
    assert accepts(tokenizer, named, call("get_time", {}))
    assert not accepts(tokenizer, named, call("get_weather", {"city": "Paris"}))


def test_tools_and_tool_choice_are_checked():
    with pytest.raises(GrammarInvalid, match=r"tools\[0\].function.name"):
        check_tools([{"type": "function", "function": {"name": "no spaces"}}])
    with pytest.raises(GrammarInvalid, match="given twice"):
        check_tools([WEATHER, WEATHER])
    with pytest.raises(GrammarInvalid, match="must be a JSON schema"):
        check_tools([{"type": "function", "function": {"name": "f", "parameters": []}}])
    with pytest.raises(GrammarInvalid, match="names no function"):
        chosen_functions(check_tools([WEATHER]), {"type": "function", "function": {"name": "get_time"}})
    with pytest.raises(GrammarInvalid, match="needs tools"):
        chosen_functions([], "required")
    assert chosen_functions(check_tools([WEATHER]), "auto") is None and chosen_functions([], "none") is None


def test_calls_parse_back_and_text_without_calls_is_content():
    text = "Let me look.\n" + call("get_weather", {"city": "Paris"}) + call("get_time", {})
    content, calls = parse_tool_calls(text)
    assert content == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert calls[0].openai()["function"]["name"] == "get_weather" and calls[0].ollama()["function"]["arguments"] == {
        "city": "Paris"}
    assert parse_tool_calls("no call <tool_call>{not json}</tool_call>") == (
        "no call <tool_call>{not json}</tool_call>", [])
    assert "get_weather" in tool_preamble(check_tools([WEATHER]))


@pytest.mark.parametrize("text", ["Let me look.\n" + call("get_time", {}), "plain text, no call", "a <tool", "<tool",
                                  "x <tool_call>{broken</tool_call> y", call("get_time", {}) + call("get_time", {}),
                                  '<tool_call>[{"name": "get_time", "arguments": {}}]</tool_call>'])
def test_streamed_text_gives_what_the_whole_text_gives(text):
    from tinyvllm.frontend.api.tool_calls import ToolCallText
    for size in (1, 3, len(text)):
        stream, shown = ToolCallText(), ""
        for i in range(0, len(text), size):
            shown += stream.feed(text[i:i + size])
            assert may_show(shown)
        rest, calls = stream.finish()
        content, expected = parse_tool_calls(text)
        assert shown + rest == content and [(c.name, c.arguments) for c in calls] == [
            (c.name, c.arguments) for c in expected]


def may_show(shown: str) -> bool:
    """No tail that could open a call, and no whitespace that could come before one."""
    return not shown or not any("<tool_call>".startswith(shown[-k:]) for k in range(1, 12)) and shown == shown.rstrip()


def test_templates_with_and_without_tools_support():
    functions = check_tools([WEATHER])
    turn = [{"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                              "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny"}]
    messages, extra = template_messages(turn, functions, "{% for m in messages %}{{ tools }}{% endfor %}")
    assert messages is turn and extra["tools"][0]["function"]["name"] == "get_weather"
    messages, extra = template_messages(turn, functions, "{{ messages }}")
    assert extra == {} and messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    assert messages[2] == {"role": "assistant", "content": call("get_weather", {"city": "Paris"}).strip()}
    assert messages[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    with_system, _ = template_messages([{"role": "system", "content": "Be brief."}] + turn[:1], functions, None)
    assert with_system[0]["content"].startswith("Be brief.\n\n") and len(with_system) == 2
    assert chat_tools(None, None) == NO_TOOLS and chat_tools([WEATHER], "none") == NO_TOOLS
    auto = chat_tools([WEATHER], None)
    assert auto.parse and auto.grammar is None and auto.functions == functions
    assert chat_tools([WEATHER], "required", parallel_tool_calls=False).grammar.count("call+") == 0


def test_forced_arguments_take_no_made_up_keys(tokenizer):
    add = {"type": "function", "function": {"name": "add", "parameters": {  # as LangChain writes a function's schema
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
    grammar = forced_grammar(chosen_functions(check_tools([add]), "required"))
    assert accepts(tokenizer, grammar, call("add", {"a": 1, "b": 2}))
    assert not accepts(tokenizer, grammar, call("add", {"a": 1, "b": 2, "c": 3}))


def test_closing_schemas_changes_subschemas_not_values():
    from tinyvllm.frontend.api.tool_calls import closed
    schema = {"type": "object", "properties": {
        "properties": {"type": "string"},  # a parameter named "properties"
        "mode": {"const": {"properties": 1}}, "nested": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "list": {"type": "array", "items": {"type": "object", "properties": {"y": {}}}}}}
    out = closed(schema)
    assert out["additionalProperties"] is False and out["properties"]["properties"] == {"type": "string"}
    assert out["properties"]["mode"] == {"const": {"properties": 1}}
    assert out["properties"]["nested"]["additionalProperties"] is False
    assert out["properties"]["list"]["items"]["additionalProperties"] is False
    assert closed({"type": "object", "properties": {}, "additionalProperties": True})["additionalProperties"] is True
