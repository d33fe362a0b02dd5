"""/v1/responses through the official `openai` SDK's responses client, unmodified (in process over httpx's ASGI
transport, against the fake engine): text, streamed events with sequence numbers, function tools and a
function_call_output turn, json_schema text format, reasoning items from a reasoning template, usage, and 400/404
without a response store."""
import json

import httpx
import openai
import pytest

from app_harness import MODEL, REPLY
from fake_engine import FakeEngine
from fake_tokenizer import CharDetokenizer, CharTokenizer
from test_reasoning import ThinkingTemplateTokenizer
from tinyvllm.frontend.api.app import build_app

pytestmark = pytest.mark.anyio
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def sdk(reply: str = REPLY, tokenizer=None, store_size: int = 0, **engine_kwargs):
    tokenizer = tokenizer or CharTokenizer()
    engine = FakeEngine(tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_ids[0],
                        max_model_len=4096, **engine_kwargs)
    app = build_app(engine, tokenizer, MODEL, 4096, make_detokenizer=CharDetokenizer, responses_store_size=store_size)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test/v1", timeout=10)
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0), engine


def prompt_of(engine) -> str:
    return CharTokenizer().decode(list(engine.requests.values())[-1].prompt_token_ids)


async def test_a_text_response_and_its_usage():
    client, engine = sdk(num_cached_tokens=4)
    response = await client.responses.create(model=MODEL, input="Hi", instructions="Be brief.")
    assert response.object == "response" and response.status == "completed" and response.id.startswith("resp_")
    assert response.output_text == REPLY and [item.type for item in response.output] == ["message"]
    assert prompt_of(engine).startswith("<system>Be brief.\n<user>Hi\n")
    usage = response.usage
    assert usage.input_tokens == len(prompt_of(engine)) and usage.input_tokens_details.cached_tokens == 4
    assert usage.output_tokens == len(REPLY) + 1 and usage.total_tokens == usage.input_tokens + usage.output_tokens
    short = await client.responses.create(model=MODEL, input="Hi", max_output_tokens=3)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
    assert short.output_text == REPLY[:3]
    async with client.responses.stream(model=MODEL, input="Hi", max_output_tokens=3) as stream:
        assert (await stream.get_final_response()).status == "incomplete"  # in a response.completed event


async def test_streamed_events_build_the_same_response():
    client, _ = sdk()
    async with client.responses.stream(model=MODEL, input=[{"role": "user", "content": "Hi"}]) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types.index("response.output_item.added") < types.index("response.content_part.added") < \
        types.index("response.output_text.delta") < types.index("response.output_text.done") < \
        types.index("response.content_part.done") < types.index("response.output_item.done")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == REPLY
    assert final.output_text == REPLY and final.status == "completed"


async def test_function_tools_and_a_function_call_output_turn():
    client, engine = sdk(CALL)
    response = await client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments) == {
        "city": "Paris"}
    async with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                       tool_choice="required") as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    assert final.output[0].type == "function_call" and list(engine.requests.values())[-1].sampling.grammar
    assert any(e.type == "response.function_call_arguments.done" for e in events)
    turn = [{"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}]
    await client.responses.create(model=MODEL, input=turn, tools=[WEATHER], max_output_tokens=5)
    assert '"city": "Paris"' in prompt_of(engine) and "Sunny" in prompt_of(engine)


async def test_a_json_schema_text_format_becomes_the_grammar():
    client, engine = sdk('{"answer": 42}')
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    response = await client.responses.create(model=MODEL, input="Answer?", text={
        "format": {"type": "json_schema", "name": "answer", "schema": schema}})
    assert json.loads(response.output_text) == {"answer": 42} and list(engine.requests.values())[-1].sampling.grammar
    assert response.text.format.type == "json_schema"


async def test_reasoning_items_and_reasoning_tokens():
    client, _ = sdk("<think>Hmm.</think>\n\nYes.", ThinkingTemplateTokenizer())
    response = await client.responses.create(model=MODEL, input="Why?", reasoning={"effort": "low"})
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == "Hmm." and response.output_text == "Yes."
    assert response.usage.output_tokens_details.reasoning_tokens == len("Hmm.")
    async with client.responses.stream(model=MODEL, input="Why?") as stream:
        events = [event async for event in stream]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Hmm."


async def test_without_a_store_ids_are_404s_and_previous_response_id_a_400():
    client, _ = sdk()
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve("resp_123")
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete("resp_123")
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        await client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_123")
    with pytest.raises(openai.BadRequestError, match="background"):
        await client.responses.create(model=MODEL, input="Hi", background=True)
    assert (await client.responses.create(model=MODEL, input="Hi", store=True)).store is False
    with pytest.raises(openai.BadRequestError, match="only function tools"):
        await client.responses.create(model=MODEL, input="Hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="gpt-5", input="Hi")
