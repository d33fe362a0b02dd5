"""stream: true through the ASGI app: SSE framing, chunk shapes, usage chunk, stop strings, errors mid-stream."""
import pytest

from app_harness import MODEL, REPLY, client_for, make_app, parse_sse
from tinyvllm.frontend.api.stop_strings import StopStringMatcher

pytestmark = pytest.mark.anyio


async def test_completion_stream(served):
    client, _, _ = served
    r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    assert len({c["created"] for c in chunks}) == 1
    for c in chunks:
        assert set(c) == {"id", "object", "created", "model", "choices"}
        assert c["object"] == "text_completion" and c["model"] == MODEL
        (choice,) = c["choices"]
        assert set(choice) == {"index", "text", "logprobs", "finish_reason", "stop_reason"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == REPLY
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]


async def test_completion_stream_with_usage(served):
    client, _, _ = served
    r = await client.post("/v1/completions", json={"prompt": "Hi", "stream": True, "max_tokens": 4,
                                                   "stream_options": {"include_usage": True}})
    events = parse_sse(r.text)
    *chunks, usage_chunk, done = events
    assert done == "[DONE]"
    assert all(c["usage"] is None for c in chunks)
    assert usage_chunk["choices"] == [] and usage_chunk["object"] == "text_completion"
    assert usage_chunk["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                                    "prompt_tokens_details": {"cached_tokens": 0}}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_chat_stream(served):
    client, _, _ = served
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "stream": True, "max_tokens": 8,
        "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    *chunks, usage_chunk, done = parse_sse(r.text)
    assert done == "[DONE]"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for c in chunks:
        assert c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-") and c["usage"] is None
        assert c["choices"][0]["logprobs"] is None
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert content == REPLY[:8]
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["stop_reason"] is None
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 8


async def test_stream_stop_string_never_leaks_partial_match(served):
    client, engine, _ = served
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "stream": True, "stop": "world", "ignore_eos": True,
        "max_tokens": 40})
    *chunks, done = parse_sse(r.text)
    texts = [c["choices"][0]["delta"].get("content", "") for c in chunks]
    assert "".join(texts) == "Hello "
    assert not any("w" in t for t in texts)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"][0]["stop_reason"] == "world"
    assert chunks[0]["id"] in engine.aborted and engine.num_active == 0


async def test_stream_text_resumes_after_a_false_stop_prefix(served):
    client, _, _ = served
    # "wox" starts like "wo" in "world" but never completes: the held-back text must come out.
    r = await client.post("/v1/completions", json={"prompt": "Hi", "stream": True, "stop": ["wox", "lo!"]})
    *chunks, done = parse_sse(r.text)
    assert "".join(c["choices"][0]["text"] for c in chunks) == REPLY
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_engine_error_mid_stream_sends_error_event_then_done():
    app, engine, _ = make_app(fail_after=3)
    client = client_for(app)
    r = await client.post("/v1/completions", json={"prompt": "Hi", "stream": True})
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    err = events[-2]["error"]
    assert "Internal server error" in err["message"] and err["type"] == "InternalServerError" and err["code"] == 500
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == REPLY[:3]


async def test_bad_streamed_request_is_a_plain_error_not_a_stream(served):
    client, _, _ = served
    r = await client.post("/v1/completions", json={"prompt": "Hi", "stream": True, "max_tokens": 0})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["type"] == "BadRequestError"


@pytest.mark.parametrize("stops,pieces,emitted,matched", [
    (["ab", "b"], ["xab"], "x", "ab"),                 # earliest match wins
    (["STOP"], ["go S", "T", "OP now"], "go ", "STOP"),  # spans three deltas, nothing of it leaks
    (["STOP"], ["go S", "Tx"], "go STx", None),         # held-back prefix released once it can't match
    (["end"], ["the e"], "the e", None),                # final delta: nothing held back
])
def test_stop_string_matcher(stops, pieces, emitted, matched):
    matcher = StopStringMatcher(stops)
    out, hit = [], None
    for i, piece in enumerate(pieces):
        text, hit = matcher.feed(piece, final=i == len(pieces) - 1)
        out.append(text)
        if hit:
            break
    assert ("".join(out), hit) == (emitted, matched)
    if len(pieces) > 1 and matched:
        assert "S" not in out[0]
