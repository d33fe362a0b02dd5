"""n > 1 through the ASGI app: one choice per child, per-choice finish and stop strings, interleaved streams; best_of
and beam search (n beams)."""
import pytest

from app_harness import client_for, make_app, parse_sse
from fake_tokenizer import CharTokenizer

pytestmark = pytest.mark.anyio

REPLIES = ["Hello world", "Hi there friend", "Hey"]
CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
USER_HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def served():
    tok = CharTokenizer()
    app, engine, _ = make_app(choice_replies=[tok.encode(r, add_special_tokens=False) for r in REPLIES])
    return client_for(app), engine


def by_index(chunks: list[dict]) -> dict[int, list[dict]]:
    """Each chunk's single choice, grouped by choice index, in arrival order."""
    groups: dict[int, list[dict]] = {}
    for c in chunks:
        (choice,) = c["choices"]
        groups.setdefault(choice["index"], []).append(choice)
    return groups


def assert_one_finish_per_choice(groups: dict[int, list[dict]]) -> None:
    for choices in groups.values():
        assert [c["finish_reason"] is not None for c in choices] == [False] * (len(choices) - 1) + [True]


async def test_completion_n3_non_streamed(served):
    client, engine = served
    r = await client.post(COMPL, json={"prompt": "Hi", "n": 3, "max_tokens": 20})
    assert r.status_code == 200, r.text
    body = r.json()
    assert engine.requests[body["id"]].sampling.n == 3
    assert body["choices"] == [{"index": i, "text": text, "logprobs": None, "finish_reason": "stop",
                                "stop_reason": None} for i, text in enumerate(REPLIES)]
    generated = sum(len(text) + 1 for text in REPLIES)  # each reply and its EOS
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": generated, "total_tokens": 3 + generated,
                             "prompt_tokens_details": {"cached_tokens": 0}}


async def test_chat_n3_non_streamed_with_per_choice_finish(served):
    client, _ = served
    r = await client.post(CHAT, json={"messages": USER_HI, "n": 3, "max_tokens": 6, "best_of": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    got = [(c["index"], c["message"], c["finish_reason"]) for c in body["choices"]]
    assert got == [(0, {"role": "assistant", "content": "Hello "}, "length"),
                   (1, {"role": "assistant", "content": "Hi the"}, "length"),
                   (2, {"role": "assistant", "content": "Hey"}, "stop")]
    assert body["usage"]["completion_tokens"] == 6 + 6 + 4


async def test_completion_n3_streamed(served):
    client, _ = served
    r = await client.post(COMPL, json={"prompt": "Hi", "n": 3, "max_tokens": 20, "stream": True,
                                       "stream_options": {"include_usage": True}})
    *chunks, usage_chunk, done = parse_sse(r.text)
    assert done == "[DONE]" and "[DONE]" not in chunks
    assert all(c["usage"] is None for c in chunks)
    groups = by_index(chunks)
    assert sorted(groups) == [0, 1, 2]
    assert {i: "".join(c["text"] for c in g) for i, g in groups.items()} == dict(enumerate(REPLIES))
    assert_one_finish_per_choice(groups)
    indices = [c["choices"][0]["index"] for c in chunks]
    assert indices != sorted(indices)  # the choices' chunks interleave
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == sum(len(text) + 1 for text in REPLIES)


async def test_chat_n3_streamed(served):
    client, _ = served
    r = await client.post(CHAT, json={"messages": USER_HI, "n": 3, "max_tokens": 20, "stream": True})
    *chunks, done = parse_sse(r.text)
    assert done == "[DONE]" and "[DONE]" not in chunks
    groups = by_index(chunks)
    assert sorted(groups) == [0, 1, 2]
    for i, choices in groups.items():
        assert choices[0]["delta"] == {"role": "assistant", "content": ""}
        assert not any("role" in c["delta"] for c in choices[1:])
        assert "".join(c["delta"].get("content", "") for c in choices) == REPLIES[i]
        assert choices[-1]["finish_reason"] == "stop" and choices[-1]["stop_reason"] is None
    assert_one_finish_per_choice(groups)


async def test_stop_string_on_one_choice_does_not_cut_the_others(served):
    client, engine = served
    r = await client.post(COMPL, json={"prompt": "Hi", "n": 3, "max_tokens": 20, "stop": ["there"]})
    body = r.json()
    got = [(c["text"], c["finish_reason"], c["stop_reason"]) for c in body["choices"]]
    assert got == [("Hello world", "stop", None), ("Hi ", "stop", "there"), ("Hey", "stop", None)]
    # Choice 1 counts up to its stop string; what the engine generated after it is dropped.
    assert body["usage"]["completion_tokens"] == len("Hello world") + 1 + len("Hi there") + len("Hey") + 1
    # Child 1 ("Hi there friend" + EOS) was still running when the others were done: the request was aborted.
    assert body["id"] in engine.aborted and engine.num_active == 0


async def test_stop_string_on_one_choice_streamed(served):
    client, engine = served
    r = await client.post(CHAT, json={"messages": USER_HI, "n": 3, "max_tokens": 20, "stop": "there",
                                      "stream": True})
    *chunks, done = parse_sse(r.text)
    assert done == "[DONE]"
    groups = by_index(chunks)
    assert_one_finish_per_choice(groups)
    texts = {i: "".join(c["delta"].get("content", "") for c in g) for i, g in groups.items()}
    assert texts == {0: "Hello world", 1: "Hi ", 2: "Hey"}
    assert (groups[1][-1]["finish_reason"], groups[1][-1]["stop_reason"]) == ("stop", "there")
    finish_order = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert finish_order.index(1) < finish_order.index(0)  # choice 1 stopped first, choice 0 went on
    assert chunks[0]["id"] in engine.aborted and engine.num_active == 0


async def test_every_choice_stopped_aborts_at_once(served):
    client, engine = served
    r = await client.post(COMPL, json={"prompt": "Hi", "n": 3, "max_tokens": 40, "ignore_eos": True, "stop": "e"})
    body = r.json()
    assert [c["text"] for c in body["choices"]] == ["H", "Hi th", "H"]
    assert body["id"] in engine.aborted and body["id"] not in engine.finished and engine.num_active == 0


async def test_engine_error_on_one_child_fails_the_request():
    app, engine, _ = make_app(fail_after=2)
    client = client_for(app)
    r = await client.post(COMPL, json={"prompt": "Hi", "n": 3})
    assert r.status_code == 500 and "worker exploded" in r.json()["error"]["message"]
    r = await client.post(COMPL, json={"prompt": "Hi", "n": 2, "stream": True})
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 500
    assert engine.num_active == 0


async def test_best_of_returns_the_n_most_likely_and_counts_every_candidates_tokens(served):
    client, engine = served
    # the fake engine gives every token logprob -1: the shorter a reply, the more likely
    r = await client.post(COMPL, json={"prompt": "Hi", "n": 2, "best_of": 3, "max_tokens": 20})
    assert r.status_code == 200, r.text
    body = r.json()
    sampling = engine.requests[body["id"]].sampling
    assert (sampling.n, sampling.logprobs) == (3, 0)  # logprobs asked for internally, to rank
    assert [(c["index"], c["text"], c["logprobs"]) for c in body["choices"]] == [(0, "Hey", None),
                                                                                 (1, "Hello world", None)]
    assert body["usage"]["completion_tokens"] == sum(len(text) + 1 for text in REPLIES)


async def test_chat_beam_search_returns_n_beams_run_as_one_token_requests(served):
    client, engine = served
    r = await client.post(CHAT, json={"messages": USER_HI, "n": 2, "max_tokens": 3, "use_beam_search": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [(c["index"], c["finish_reason"]) for c in body["choices"]] == [(0, "length"), (1, "length")]
    assert all(len(c["message"]["content"]) == 3 for c in body["choices"])
    steps = [req.sampling for req in engine.requests.values()]
    assert len(steps) == 1 + 2 + 2 and all((s.max_tokens, s.logprobs) == (1, 4) for s in steps)
    assert body["usage"]["completion_tokens"] == 2 * 3
