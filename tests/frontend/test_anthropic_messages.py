"""/v1/messages and /v1/messages/count_tokens through the official `anthropic` SDK, unmodified (in process, over
httpx's ASGI transport, against the fake engine): a plain and a streamed reply with Anthropic's event order, tool
use and a tool_result turn, thinking blocks from a reasoning template, token counts, x-api-key, and every error in
Anthropic's shape."""
import json

import anthropic
import httpx
import httpx2  # the SDK's own fork of httpx (it refuses an httpx client)
import pytest

from app_harness import MODEL, REPLY
from fake_engine import FakeEngine
from fake_tokenizer import CharDetokenizer, CharTokenizer
from test_reasoning import ThinkingTemplateTokenizer
from tinyvllm.frontend.api.app import build_app

pytestmark = pytest.mark.anyio
USER = [{"role": "user", "content": "Hi"}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def sdk(reply: str = REPLY, tokenizer=None, api_key: str | None = None, key_sent: str = "unused",
        max_model_len: int = 4096, **engine_kwargs):
    tokenizer = tokenizer or CharTokenizer()
    engine = FakeEngine(tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_ids[0],
                        max_model_len=max_model_len, **engine_kwargs)
    app = build_app(engine, tokenizer, MODEL, max_model_len, make_detokenizer=CharDetokenizer, api_key=api_key,
                    max_body_bytes=64 * 1024)
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app), base_url="http://test", timeout=10)
    client = anthropic.AsyncAnthropic(base_url="http://test", api_key=key_sent, http_client=http, max_retries=0)
    client.app = app
    return client, engine


def prompt_of(engine) -> str:
    return CharTokenizer().decode(list(engine.requests.values())[-1].prompt_token_ids)


async def test_a_plain_message():
    client, engine = sdk()
    message = await client.messages.create(model=MODEL, max_tokens=50, messages=USER, system="Be brief.")
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [(b.type, b.text) for b in message.content] == [("text", REPLY)]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    prompt = prompt_of(engine)
    assert prompt.startswith("<system>Be brief.\n<user>Hi\n")
    assert message.usage.input_tokens == len(prompt) and message.usage.output_tokens == len(REPLY) + 1
    assert message.usage.cache_read_input_tokens == 0
    cached, _ = sdk(num_cached_tokens=5)  # Anthropic's prompt = input_tokens + cache_read_input_tokens
    usage = (await cached.messages.create(model=MODEL, max_tokens=50, messages=USER, system="Be brief.")).usage
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (len(prompt) - 5, 5)
    short = await client.messages.create(model=MODEL, max_tokens=3, messages=USER)
    assert short.stop_reason == "max_tokens" and short.content[0].text == REPLY[:3]
    stopped = await client.messages.create(model=MODEL, max_tokens=50, messages=USER, stop_sequences=["wor"])
    assert (stopped.stop_reason, stopped.stop_sequence, stopped.content[0].text) == ("stop_sequence", "wor", "Hello ")


async def test_a_streamed_message_sends_anthropics_events_in_order():
    client, _ = sdk()
    async with client.messages.stream(model=MODEL, max_tokens=50, messages=USER) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()
    kinds = [e.type for e in events if e.type not in ("text",)]  # the SDK adds "text" events of its own
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == REPLY
    assert final.content[0].text == REPLY and final.stop_reason == "end_turn"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(client.app), base_url="http://test") as http:
        r = await http.post("/v1/messages", json={"model": MODEL, "max_tokens": 50, "messages": USER, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = [frame.split("\n") for frame in r.text.strip().split("\n\n")]  # event: <name>, data: <json>
    names = [lines[0].removeprefix("event: ") for lines in frames]
    assert all(json.loads(lines[1].removeprefix("data: "))["type"] == name for name, lines in zip(names, frames))
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"  # (the SDK hides the ping)


async def test_tool_use_and_a_tool_result_turn():
    client, engine = sdk(CALL)
    message = await client.messages.create(model=MODEL, max_tokens=200, messages=USER, tools=[WEATHER])
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.input == {"city": "Paris"}
    assert message.stop_reason == "tool_use"
    async with client.messages.stream(model=MODEL, max_tokens=200, messages=USER, tools=[WEATHER]) as stream:
        final = await stream.get_final_message()
    assert final.content[0].type == "tool_use" and final.content[0].input == {"city": "Paris"}
    turn = USER + [{"role": "assistant", "content": [b.model_dump() for b in message.content]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "Sunny"}]}]
    await client.messages.create(model=MODEL, max_tokens=5, messages=turn, tools=[WEATHER])
    prompt = prompt_of(engine)
    assert '"city": "Paris"' in prompt and "Sunny" in prompt  # the call and its result reach the template
    failed = turn[:-1] + [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": block.id, "content": [{"type": "text", "text": "No such city"}],
         "is_error": True}, {"type": "text", "text": "Try"}, {"type": "text", "text": "again"}]}]
    await client.messages.create(model=MODEL, max_tokens=5, messages=failed, tools=[WEATHER])
    assert "Error: No such city" in prompt_of(engine) and "Try\nagain" in prompt_of(engine)
    forced = await client.messages.create(model=MODEL, max_tokens=200, messages=USER, tools=[WEATHER],
                                          tool_choice={"type": "tool", "name": "get_weather"})
    assert list(engine.requests.values())[-1].sampling.grammar  # tool_choice tool: a grammar forces the call
    assert forced.content[0].type == "tool_use"


async def test_thinking_blocks_from_a_reasoning_template():
    client, _ = sdk("<think>Hmm.</think>\n\nYes.", ThinkingTemplateTokenizer())
    message = await client.messages.create(model=MODEL, max_tokens=100, messages=USER)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content] == [
        ("thinking", "Hmm."), ("text", "Yes.")]
    async with client.messages.stream(model=MODEL, max_tokens=100, messages=USER,
                                      thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        events = [event async for event in stream]
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == "Hmm."
    assert "".join(d.text for d in deltas if d.type == "text_delta") == "Yes."
    plain, _ = sdk()  # Claude Code sends a budget whatever the model: one that cannot hold it ignores it
    message = await plain.messages.create(model=MODEL, max_tokens=100, messages=USER,
                                          thinking={"type": "enabled", "budget_tokens": 1024})
    assert message.content[0].text == REPLY
    assert (await plain.messages.count_tokens(model=MODEL, messages=USER, thinking={
        "type": "enabled", "budget_tokens": 1024})).input_tokens > 0


async def test_count_tokens_is_the_prompts_length():
    client, engine = sdk()
    counted = await client.messages.count_tokens(model=MODEL, messages=USER, system="Be brief.")
    await client.messages.create(model=MODEL, max_tokens=1, messages=USER, system="Be brief.")
    assert counted.input_tokens == len(list(engine.requests.values())[-1].prompt_token_ids)


async def test_errors_come_in_anthropics_shape():
    client, _ = sdk()
    with pytest.raises(anthropic.NotFoundError) as e:
        await client.messages.create(model="claude-from-elsewhere", max_tokens=5, messages=USER)
    assert e.value.body == {"type": "error", "error": {"type": "not_found_error", "message": e.value.body["error"][
        "message"]}} and "claude-from-elsewhere" in e.value.body["error"]["message"]
    bad = [({"model": MODEL, "messages": USER}, "max_tokens"),
           ({"model": MODEL, "max_tokens": 5, "messages": []}, "messages"),
           ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [
               {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}, "images"),
           ({"model": MODEL, "max_tokens": 5, "messages": USER, "temperature": 1.5}, "temperature"),
           ({"model": MODEL, "max_tokens": 5, "messages": USER, "tools": [WEATHER],
             "tool_choice": {"type": "tool"}}, "name")]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(client.app), base_url="http://test") as http:
        for body, word in bad:
            r = await http.post("/v1/messages?beta=true", json=body)
            assert r.status_code == 400 and r.json()["type"] == "error", r.text
            assert r.json()["error"]["type"] == "invalid_request_error" and word in r.json()["error"]["message"], r.text
        r = await http.post("/v1/messages", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = await http.post("/v1/messages", content=b"x" * (64 * 1024 + 1))
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large", r.text
        r = await http.get("/v1/messages")
        assert r.status_code == 405 and r.json()["type"] == "error", r.text


async def test_max_tokens_is_a_ceiling_and_a_dead_engine_is_a_503_before_any_event():
    client, engine = sdk(max_model_len=64)
    message = await client.messages.create(model=MODEL, max_tokens=32000, messages=USER)  # as Claude Code asks
    assert message.content[0].text == REPLY
    assert list(engine.requests.values())[-1].sampling.max_tokens == 64 - len(prompt_of(engine))
    engine.mark_dead("the worker died")
    with pytest.raises(anthropic.APIStatusError) as e:
        await client.messages.create(model=MODEL, max_tokens=5, messages=USER, stream=True)
    assert e.value.status_code == 503 and e.value.body["error"]["type"] == "overloaded_error"


async def test_x_api_key_is_accepted_and_a_wrong_key_is_refused_in_anthropics_shape():
    client, _ = sdk(api_key="s3cret", key_sent="s3cret")
    assert (await client.messages.create(model=MODEL, max_tokens=5, messages=USER)).content[0].text == REPLY[:5]
    body = {"model": MODEL, "max_tokens": 5, "messages": USER}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(client.app), base_url="http://test") as http:
        # a right Bearer with a stale x-api-key beside it (both of Claude Code's variables set) is let in
        r = await http.post("/v1/messages", json=body, headers={"Authorization": "Bearer s3cret", "x-api-key": "old"})
        assert r.status_code == 200
        r = await http.post("/v1/chat/completions", json={"messages": USER}, headers={"x-api-key": "s3cret"})
        assert r.status_code == 401 and "error" in r.json() and "type" not in r.json()  # OpenAI's routes: Bearer
    wrong, _ = sdk(api_key="s3cret", key_sent="wrong")
    with pytest.raises(anthropic.AuthenticationError) as e:
        await wrong.messages.create(model=MODEL, max_tokens=5, messages=USER)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"
    assert json.dumps(e.value.body)  # (a JSON body, not text)
