"""Bad requests through the real server get OpenAI-shaped errors ({"error": {message, type, param, code}}) with
the right status, and leave the server serving."""
import httpx
import pytest

from tests.e2e.http_helpers import assert_openai_error, chat_body, complete, completion_body, stream
from tests.e2e.server_process import MODEL_NAME

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
LONG_PROMPT = "hello " * 600  # > 512 tokens, the tiny model's max_model_len

# (id, path, body: dict, or bytes sent as is, expected status, expected param or "any")
CASES = [
    ("malformed-json", COMPLETIONS, b'{"prompt": "hi", ', 400, None),
    ("not-json-at-all", CHAT, b"hello there", 400, None),
    ("body-is-a-list", COMPLETIONS, b'["hi"]', 400, None),
    ("missing-prompt", COMPLETIONS, {"model": MODEL_NAME, "max_tokens": 4}, 400, "prompt"),
    ("missing-messages", CHAT, {"model": MODEL_NAME, "max_tokens": 4}, 400, "messages"),
    ("empty-messages", CHAT, {"model": MODEL_NAME, "messages": []}, 400, "messages"),
    ("messages-is-a-string", CHAT, {"model": MODEL_NAME, "messages": "hi"}, 400, "messages"),
    ("message-without-role", CHAT, {"model": MODEL_NAME, "messages": [{"content": "hi"}]}, 400, "messages"),
    ("prompt-is-a-number", COMPLETIONS, completion_body(42), 400, "prompt"),
    ("max-tokens-is-a-string", COMPLETIONS, completion_body("hi", max_tokens="10"), 400, "max_tokens"),
    ("max-tokens-is-a-float", CHAT, chat_body("hi", max_tokens=2.5), 400, "max_tokens"),
    ("temperature-is-a-string", COMPLETIONS, completion_body("hi", temperature="hot"), 400, "temperature"),
    ("stream-is-a-string", CHAT, chat_body("hi", stream="yes"), 400, "stream"),
    ("stop-is-a-number", COMPLETIONS, completion_body("hi", stop=5), 400, "stop"),
    ("model-is-a-number", CHAT, {"model": 7, "messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
    ("negative-temperature", COMPLETIONS, completion_body("hi", temperature=-1), 400, "any"),
    ("token-out-of-vocab", COMPLETIONS, completion_body([1, 999999]), 400, "prompt"),
    ("max-tokens-0", COMPLETIONS, completion_body("hi", max_tokens=0), 400, "max_tokens"),
    ("max-tokens-minus-1", COMPLETIONS, completion_body("hi", max_tokens=-1), 400, "max_tokens"),
    ("chat-max-tokens-0", CHAT, chat_body("hi", max_tokens=0), 400, "max_tokens"),
    ("chat-max-tokens-minus-1-streamed", CHAT, chat_body("hi", max_tokens=-1, stream=True), 400, "max_tokens"),
    ("prompt-longer-than-max-model-len", COMPLETIONS, completion_body(LONG_PROMPT, max_tokens=4), 400, "any"),
    ("chat-longer-than-max-model-len", CHAT, chat_body(LONG_PROMPT, max_tokens=4), 400, "any"),
    ("prompt-plus-max-tokens-too-long", COMPLETIONS, completion_body("hi", max_tokens=600), 400, "max_tokens"),
    ("unknown-model", COMPLETIONS, {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ("unknown-model-chat-streamed", CHAT, {**chat_body("hi", stream=True), "model": "gpt-4"}, 404, "model"),
]


@pytest.mark.parametrize("case,path,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_an_openai_error(server, case, path, body, status, param):
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body}
    r = httpx.post(server.url + path, timeout=60, **kwargs)
    err = assert_openai_error(r, status, param)
    if case.endswith("longer-than-max-model-len"):
        assert "maximum context length is 512" in err["message"], err
    if status == 404:
        assert err["type"] == "NotFoundError" and "gpt-4" in err["message"], err


def test_unknown_route_and_wrong_method(server):
    assert_openai_error(httpx.get(server.url + "/v1/nothing-here", timeout=30), 404)
    assert_openai_error(httpx.get(server.url + "/v1/completions", timeout=30), 405)


def test_oversized_headers_get_a_431(server):
    # the request gate bounds headers at 16 KiB; uvicorn's parser lets heads up to 64 KiB through to it
    for size_kib in (17, 40, 60):
        r = httpx.post(server.url + COMPLETIONS, json=completion_body("hi", max_tokens=1), timeout=30,
                       headers={"X-Padding": "x" * size_kib * 1024})
        assert r.status_code == 431 and r.json()["error"]["type"] == "RequestHeaderFieldsTooLargeError", size_kib
    with pytest.raises(httpx.HTTPError):  # past that, the parser drops the connection (a 400 or a reset)
        r = httpx.post(server.url + COMPLETIONS, json=completion_body("hi", max_tokens=1), timeout=30,
                       headers={"X-Padding": "x" * 1024 * 1024})
        r.raise_for_status()
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


def test_server_still_serves_after_bad_input(server):
    for path, body, *_ in [c[1:] for c in CASES]:  # all the bad requests again, back to back
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        assert httpx.post(server.url + path, timeout=60, **kwargs).status_code in (400, 404)
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    models = httpx.get(server.url + "/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [MODEL_NAME]
    text, finish = complete(server.url, COMPLETIONS, completion_body("Hello", max_tokens=4, temperature=0))
    assert text and finish == "length"
    res = stream(server.url, CHAT, chat_body("Hello", max_tokens=4, temperature=0))
    assert res.status == 200 and res.done and not res.errors and res.text


def test_a_prompt_longer_than_the_whole_kv_cache_is_a_400(server_factory):
    """4 blocks of 16 tokens hold 64 tokens, less than the model's 512: the server serves max_model_len 64 (and says
    so in /v1/models and its log), so a longer prompt is the usual context-length 400, not an engine error."""
    server = server_factory("--num-kv-blocks", "4", "--block-size", "16")
    assert "fewer than max_model_len 512: serving max_model_len 64" in server.log()
    assert httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["max_model_len"] == 64
    for path, body in [(COMPLETIONS, completion_body("hello " * 100, max_tokens=4)),
                       (CHAT, chat_body("hello " * 100, max_tokens=4, stream=True))]:
        err = assert_openai_error(httpx.post(server.url + path, json=body, timeout=60), 400)
        assert "maximum context length is 64" in err["message"], err
    text, finish = complete(server.url, COMPLETIONS, completion_body("Hello", max_tokens=4, temperature=0))
    assert text and finish == "length"
