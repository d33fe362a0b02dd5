"""frontend/cli/bench/serve_client.py against a fake streaming endpoint (httpx.MockTransport): timings, token
counts, both endpoint kinds, and failures that come back as failed results instead of raising."""
import asyncio
import json

import httpx
import pytest

from tinyvllm.frontend.cli.bench.progress import Progress
from tinyvllm.frontend.cli.bench.random_prompts import RandomPrompt
from tinyvllm.frontend.cli.bench.serve import run_level
from tinyvllm.frontend.cli.bench.serve_client import Target, send_request

GAP_S = 0.05


def sse(*payloads) -> list[bytes]:
    return [f"data: {p if isinstance(p, str) else json.dumps(p)}\n\n".encode() for p in payloads]


def completion_chunk(text):
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}]}


def chat_chunk(delta):
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def usage(prompt_tokens, completion_tokens):
    return {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}


def streaming_client(events: list[bytes], status: int = 200, seen: list | None = None) -> httpx.AsyncClient:
    async def body():
        for event in events:
            await asyncio.sleep(GAP_S)
            yield event

    async def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(json.loads(request.content))
        return httpx.Response(status, content=body(), headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://fake")


def run(coro):
    return asyncio.run(coro)


async def one(events, target=None, status=200, seen=None):
    async with streaming_client(events, status, seen) as client:
        return await send_request(client, target or Target("http://fake/v1/completions", "m"), "hi there", 2, 4)


def test_completions_stream_gives_ttft_itl_and_usage_counts():
    seen = []
    events = sse(*(completion_chunk(t) for t in ("a", "b", "", "c", "d")), usage(7, 4), "[DONE]")
    r = run(one(events, Target("http://fake/v1/completions", "m", ignore_eos=True), seen=seen))
    assert r.success and r.error == ""
    assert len(r.itl) == 3  # four chunks with content; the empty one is not a token boundary
    assert r.ttft >= GAP_S * 0.9 and all(gap >= GAP_S * 0.9 for gap in r.itl)
    assert r.itl[1] >= 2 * GAP_S * 0.9  # the gap across the empty chunk
    assert r.latency >= r.ttft + sum(r.itl)
    assert (r.output_tokens, r.prompt_len) == (4, 7)  # from usage
    assert r.tpot == pytest.approx((r.latency - r.ttft) / 3)
    assert seen == [{"model": "m", "max_tokens": 4, "temperature": 0.0, "stream": True,
                     "stream_options": {"include_usage": True}, "skip_special_tokens": False, "prompt": "hi there",
                     "ignore_eos": True}]


def test_chat_stream_without_usage_counts_content_chunks():
    seen = []
    events = sse(chat_chunk({"role": "assistant", "content": ""}), chat_chunk({"reasoning_content": "hmm"}),
                 chat_chunk({"content": "x"}), chat_chunk({"content": "y"}), "[DONE]")
    r = run(one(events, Target("http://fake/v1/chat/completions", "m", chat=True), seen=seen))
    assert r.success and (r.output_tokens, r.prompt_len, len(r.itl)) == (3, 2, 2)
    assert seen[0]["messages"] == [{"role": "user", "content": "hi there"}] and "ignore_eos" not in seen[0]


@pytest.mark.parametrize("events,status,error", [
    (sse({"error": {"message": "nope", "type": "BadRequestError"}}), 400, "HTTP 400"),
    (sse(completion_chunk("a"), {"error": {"message": "worker exploded"}}, "[DONE]"), 200, "worker exploded"),
    (sse(usage(2, 0), "[DONE]"), 200, "without any content"),
    ([b"data: {not json\n\n"], 200, "JSONDecodeError"),
])
def test_failures_come_back_as_failed_results(events, status, error):
    r = run(one(events, status=status))
    assert not r.success and error in r.error and r.output_tokens == 0


def test_a_connection_error_is_a_failed_result():
    async def go():
        def refuse(request):
            raise httpx.ConnectError("connection refused")
        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
            return await send_request(client, Target("http://fake/v1/completions", "m"), "p", 1, 4)
    r = run(go())
    assert not r.success and "ConnectError" in r.error


def test_run_level_keeps_order_limits_concurrency_and_survives_failures():
    in_flight, peak, calls = 0, 0, 0

    async def handler(request):
        nonlocal in_flight, peak, calls
        calls += 1
        if json.loads(request.content)["prompt"] == "bad":
            return httpx.Response(500, text="boom")
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return httpx.Response(200, content=b"".join(sse(completion_chunk("z"), usage(3, 1), "[DONE]")))

    async def go():
        prompts = [RandomPrompt(t, [0, 0, 0]) for t in ("a", "bad", "c", "d", "e")]
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await run_level(client, Target("http://fake/v1/completions", "m"), prompts, 1, 2, float("inf"), 0,
                                   Progress(5, enabled=False))

    results, duration = run(go())
    assert calls == 5 and peak == 2 and duration > 0
    assert [r.success for r in results] == [True, False, True, True, True]
