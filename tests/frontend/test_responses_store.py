"""The Responses API's opt-in store (--responses-store-size) through the official `openai` SDK, unmodified:
previous_response_id continues a conversation (a function call's output too), GET and DELETE, least recently used
out first, store false kept out, and background responses: polled, streamed again from a sequence number, cancelled
(their engine request aborted), never evicted while they run."""
import asyncio

import openai
import pytest

from app_harness import MODEL, REPLY
from test_responses_api import CALL, WEATHER, prompt_of, sdk

pytestmark = pytest.mark.anyio


async def test_previous_response_id_continues_the_conversation():
    client, engine = sdk(store_size=4)
    first = await client.responses.create(model=MODEL, input="Hi", instructions="Be brief.")
    assert first.store is True and (await client.responses.retrieve(first.id)).output_text == REPLY
    second = await client.responses.create(model=MODEL, input="And then?", previous_response_id=first.id,
                                           instructions="Be kind.")
    # the earlier turns and their answer, this input; only this request's instructions (as OpenAI does)
    assert prompt_of(engine) == f"<system>Be kind.\n<user>Hi\n<assistant>{REPLY}\n<user>And then?\n<assistant>"
    assert second.previous_response_id == first.id
    async with client.responses.stream(model=MODEL, input="Last.", previous_response_id=second.id) as stream:
        await stream.get_final_response()
    assert prompt_of(engine).count(f"<assistant>{REPLY}\n") == 2 and "<user>Last.\n" in prompt_of(engine)


async def test_a_function_calls_output_continues_the_response_that_called_it():
    client, engine = sdk(CALL, store_size=4)
    called = await client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                           tool_choice="required")
    (call,) = called.output
    await client.responses.create(model=MODEL, previous_response_id=called.id, tools=[WEATHER], max_output_tokens=5,
                                  input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}])
    prompt = prompt_of(engine)
    assert prompt.index("Weather in Paris?") < prompt.index('"city": "Paris"') < prompt.index("Sunny")


async def test_delete_store_false_and_the_least_recently_used_out_first():
    client, _ = sdk(store_size=2)
    a, b = [await client.responses.create(model=MODEL, input=text) for text in ("a", "b")]
    await client.responses.retrieve(a.id)  # a is now the more recently used
    c = await client.responses.create(model=MODEL, input="c")
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(b.id)
    with pytest.raises(openai.NotFoundError, match=b.id):
        await client.responses.create(model=MODEL, input="more", previous_response_id=b.id)
    assert (await client.responses.delete(a.id)) is None  # the SDK returns nothing for the deleted body
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(a.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(a.id)
    unkept = await client.responses.create(model=MODEL, input="d", store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unkept.id)
    assert (await client.responses.retrieve(c.id)).status == "completed"
    with pytest.raises(openai.BadRequestError, match="synchronous"):
        await client.responses.cancel(c.id)


async def test_a_background_response_is_polled_and_streamed_again():
    client, engine = sdk(store_size=2)
    engine.hold.clear()
    queued = await client.responses.create(model=MODEL, input="Hi", background=True)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    assert (await client.responses.retrieve(queued.id)).status in ("queued", "in_progress")
    engine.hold.set()
    for _ in range(200):
        if (done := await client.responses.retrieve(queued.id)).status == "completed":
            break
        await asyncio.sleep(0.01)
    assert done.output_text == REPLY
    replayed = [event async for event in await client.responses.retrieve(queued.id, stream=True)]
    assert [e.sequence_number for e in replayed] == list(range(len(replayed)))
    assert replayed[-1].type == "response.completed" and replayed[-1].response.output_text == REPLY
    later = [event async for event in await client.responses.retrieve(queued.id, stream=True, starting_after=3)]
    assert later == replayed[4:]
    for bad in ("-5", "x", "²"):
        with pytest.raises(openai.BadRequestError, match="starting_after"):
            await client.responses.retrieve(queued.id, stream=True, extra_query={"starting_after": bad})
    async with client.responses.stream(model=MODEL, input="Hi", background=True) as stream:
        assert (await stream.get_final_response()).output_text == REPLY  # a background stream: the same events


async def test_cancelling_a_background_response_aborts_its_request():
    client, engine = sdk(store_size=1)
    engine.hold.clear()
    running = await client.responses.create(model=MODEL, input="Hi", background=True)
    with pytest.raises(openai.BadRequestError, match="only a finished response can be continued"):
        await client.responses.create(model=MODEL, input="And?", previous_response_id=running.id)
    with pytest.raises(openai.APIStatusError, match="running") as full:  # never evicted while it runs
        await client.responses.create(model=MODEL, input="Hi", background=True)
    assert full.value.status_code == 503
    while running.id not in engine.requests:  # (held before its first token)
        await asyncio.sleep(0.01)
    cancelled = await client.responses.cancel(running.id)
    assert cancelled.status == "cancelled" and engine.aborted == [running.id]
    assert (await client.responses.retrieve(running.id)).status == "cancelled"
    assert (await client.responses.cancel(running.id)).status == "cancelled"  # again: the same answer
    engine.hold.set()
    assert (await client.responses.create(model=MODEL, input="Hi")).store is True  # the cancelled one may go now


async def test_a_store_full_of_running_background_responses_still_answers_the_others():
    client, _ = sdk("x" * 400, store_size=1, step_delay_s=0.05)
    running = await client.responses.create(model=MODEL, input="Hi", background=True)  # ~20 s of tokens, cancelled
    unkept = await client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    assert unkept.output_text == "xx" and unkept.store is False  # answered all the same, and not kept
    assert (await client.responses.retrieve(running.id)).status == "in_progress"
    cancelled = await client.responses.cancel(running.id)
    assert cancelled.status == "cancelled" and cancelled.output[0].status == "incomplete"  # the item it was writing
