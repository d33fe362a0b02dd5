"""The official `anthropic` SDK, unmodified, against the real server (Claude Code's way in: ANTHROPIC_BASE_URL):
a message equal to the chat route's reply, the same streamed, a forced tool call whose input follows its schema
and a tool_result turn, count_tokens equal to the prompt's tokens, and an error in Anthropic's shape."""
import anthropic
import jsonschema

from tests.e2e.http_helpers import chat_body, complete
from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S

PROMPT = "Write a haiku about the sea."
GREEDY = {"temperature": 0}  # (the 2026 SDK no longer has the parameter; older clients send it, and it is honoured)
WEATHER = {"name": "get_weather", "description": "The weather in a city",  # bounded: a call fits max_tokens
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                            "required": ["city", "days"], "additionalProperties": False}}


def sdk(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)


def test_messages_plain_and_streamed_equal_the_chat_route(server):
    client, messages = sdk(server), [{"role": "user", "content": PROMPT}]
    chat_text, _ = complete(server.url, "/v1/chat/completions", chat_body(PROMPT, max_tokens=8, temperature=0))
    message = client.messages.create(model=MODEL_NAME, max_tokens=8, extra_body=GREEDY, messages=messages)
    assert message.content[0].type == "text" and message.content[0].text == chat_text
    assert message.stop_reason in ("max_tokens", "end_turn") and message.usage.output_tokens <= 8
    with client.messages.stream(model=MODEL_NAME, max_tokens=8, extra_body=GREEDY, messages=messages) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    prompt = lambda usage: usage.input_tokens + usage.cache_read_input_tokens  # noqa: E731 (the cache's are apart)
    assert streamed == chat_text and prompt(final.usage) == prompt(message.usage)
    assert final.usage.cache_read_input_tokens > 0  # the same prompt again: its blocks came from the prefix cache
    counted = client.messages.count_tokens(model=MODEL_NAME, messages=messages)
    assert counted.input_tokens == prompt(message.usage)


def test_a_forced_tool_call_follows_its_schema_and_a_tool_result_turn_is_answered(server):
    client, messages = sdk(server), [{"role": "user", "content": "What is the weather in Paris?"}]
    message = client.messages.create(model=MODEL_NAME, max_tokens=128, extra_body=GREEDY, messages=messages,
                                     tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True})
    calls = [b for b in message.content if b.type == "tool_use"]
    assert calls and message.stop_reason == "tool_use", message
    jsonschema.validate(calls[0].input, WEATHER["input_schema"])
    turn = messages + [{"role": "assistant", "content": [b.model_dump() for b in message.content]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                                     "content": "Sunny, 21 C"}]}]
    answer = client.messages.create(model=MODEL_NAME, max_tokens=8, extra_body=GREEDY, messages=turn, tools=[WEATHER],
                                    tool_choice={"type": "none"})
    assert answer.content and answer.content[0].type == "text"
    counted = [client.messages.count_tokens(model=MODEL_NAME, messages=m, tools=[WEATHER], tool_choice={"type": "none"})
               .input_tokens for m in (messages, turn)]
    used = answer.usage.input_tokens + answer.usage.cache_read_input_tokens
    assert used == counted[1] > counted[0]  # the call and its result are in the prompt


def test_an_error_in_anthropics_shape(server):
    try:
        sdk(server).messages.create(model="not-served", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    except anthropic.NotFoundError as e:
        assert e.status_code == 404 and e.body["type"] == "error" and e.body["error"]["type"] == "not_found_error"
    else:
        raise AssertionError("a model the server does not serve was answered")
