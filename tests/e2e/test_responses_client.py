"""The official `openai` SDK's responses client (Codex speaks only this API) against the real server: a response
equal to the chat route's reply, the same streamed, a required function call whose arguments follow its schema and
a function_call_output turn, a json_schema text format that validates, and previous_response_id (the shared server
keeps a response store) equal to sending the whole conversation."""
import json

import jsonschema
import openai

from tests.e2e.http_helpers import chat_body, complete
from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S

PROMPT = "Write a haiku about the sea."
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                          "required": ["city", "days"], "additionalProperties": False}}


def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)


def test_responses_plain_and_streamed_equal_the_chat_route(server):
    client = sdk(server)
    chat_text, _ = complete(server.url, "/v1/chat/completions", chat_body(PROMPT, max_tokens=8, temperature=0))
    response = client.responses.create(model=MODEL_NAME, input=PROMPT, max_output_tokens=8, temperature=0)
    assert response.output_text == chat_text and response.usage.output_tokens <= 8
    with client.responses.stream(model=MODEL_NAME, input=PROMPT, max_output_tokens=8, temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == chat_text == final.output_text
    assert final.usage.input_tokens == response.usage.input_tokens and final.usage.input_tokens_details.cached_tokens


def test_a_required_function_call_and_a_function_call_output_turn(server):
    client, question = sdk(server), [{"role": "user", "content": "What is the weather in Paris?"}]
    response = client.responses.create(model=MODEL_NAME, input=question, tools=[WEATHER], tool_choice="required",
                                       parallel_tool_calls=False, max_output_tokens=128, temperature=0)
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and response.status == "completed", response
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    turn = question + [{"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
                        "arguments": calls[0].arguments},
                       {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}]
    answer = client.responses.create(model=MODEL_NAME, input=turn, tools=[WEATHER], tool_choice="none",
                                     max_output_tokens=8, temperature=0)
    assert answer.output_text and answer.usage.input_tokens > 0


def test_a_json_schema_format_validates(server):
    schema = {"type": "object", "properties": {"mood": {"enum": ["calm", "stormy"]},
                                               "waves": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["mood", "waves"], "additionalProperties": False}
    response = sdk(server).responses.create(model=MODEL_NAME, input=PROMPT, max_output_tokens=40, temperature=0,
                                            text={"format": {"type": "json_schema", "name": "sea", "schema": schema}})
    jsonschema.validate(json.loads(response.output_text), schema)


def test_previous_response_id_equals_sending_the_whole_conversation(server):
    client = sdk(server)
    first = client.responses.create(model=MODEL_NAME, input=PROMPT, max_output_tokens=8, temperature=0)
    assert first.store and client.responses.retrieve(first.id).output_text == first.output_text
    follow = client.responses.create(model=MODEL_NAME, input="Another one.", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    whole = client.responses.create(model=MODEL_NAME, max_output_tokens=8, temperature=0, store=False, input=[
        {"role": "user", "content": PROMPT}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another one."}])
    assert follow.output_text == whole.output_text and follow.usage.input_tokens == whole.usage.input_tokens
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
