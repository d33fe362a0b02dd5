"""Bad input never reaches the engine and never gives a 500: each case gets an OpenAI-shaped 4xx."""
import threading

import pytest

from app_harness import MAX_MODEL_LEN, MODEL, client_for, make_app

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
USER_HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def served():
    app, engine, tokenizer = make_app()
    return client_for(app), engine, tokenizer


def _assert_error(r, status: int, type_: str, message_part: str = "") -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    err = body["error"]
    assert err["type"] == type_ and err["code"] == status and isinstance(err["message"], str)
    assert message_part in err["message"], err["message"]
    return err


BAD_REQUESTS = [
    (COMPL, {}, "'prompt' is required"),
    (COMPL, {"prompt": 5}, "'prompt' must be a list of integers"),
    (COMPL, {"prompt": [1, "a"]}, "list of integers"),
    (COMPL, {"prompt": []}, "must not be empty"),
    (COMPL, {"prompt": ["a", "b"]}, "Multiple prompts"),
    (COMPL, {"prompt": [1, -4]}, "out of vocabulary"),
    (COMPL, {"prompt": "", "add_special_tokens": False}, "The prompt is empty"),
    (COMPL, {"prompt": "Hi", "max_tokens": 0}, "max_tokens must be at least 1"),
    (COMPL, {"prompt": "Hi", "max_tokens": -3}, "max_tokens must be at least 1"),
    (COMPL, {"prompt": "Hi", "max_tokens": "5"}, "'max_tokens' must be an integer"),
    (COMPL, {"prompt": "Hi", "max_tokens": True}, "'max_tokens' must be an integer"),
    (COMPL, {"prompt": "Hi", "max_tokens": 2.5}, "'max_tokens' must be an integer"),
    (COMPL, {"prompt": "Hi", "n": 0}, "n must be between 1 and 128, got 0"),
    (COMPL, {"prompt": "Hi", "n": -1}, "n must be between 1 and 128"),
    (COMPL, {"prompt": "Hi", "n": 129}, "n must be between 1 and 128, got 129"),
    (COMPL, {"prompt": "Hi", "n": 2.0}, "'n' must be an integer"),
    (CHAT, {"messages": USER_HI, "n": 0}, "n must be between 1 and 128"),
    (CHAT, {"messages": USER_HI, "n": 1000}, "n must be between 1 and 128"),
    (COMPL, {"prompt": "Hi", "n": 2, "best_of": 3, "stream": True}, "best_of > n is not supported with stream"),
    (COMPL, {"prompt": "Hi", "use_beam_search": True, "stream": True}, "Streaming is not supported with beam search"),
    (COMPL, {"prompt": "Hi", "use_beam_search": True, "n": 11}, "Beam search width (n) must be at most 10, got 11"),
    (COMPL, {"prompt": "Hi", "use_beam_search": True, "best_of": 2}, "best_of > n is not supported with beam search"),
    (COMPL, {"prompt": "Hi", "n": 3, "best_of": 2}, "best_of must be greater than or equal to n"),
    (COMPL, {"prompt": "Hi", "guided_regex": "a+", "min_tokens": 3}, "min_tokens and ignore_eos are not supported"),
    (CHAT, {"messages": USER_HI, "response_format": {"type": "json_object"}, "ignore_eos": True},
     "min_tokens and ignore_eos are not supported with structured output"),
    (COMPL, {"prompt": "Hi", "temperature": -0.1}, "temperature"),
    (COMPL, {"prompt": "Hi", "temperature": "hot"}, "'temperature' must be a number"),
    (COMPL, {"prompt": "Hi", "top_k": 10**30}, "top_k must be at most"),  # was a 500: msgpack int overflow
    (COMPL, {"prompt": "Hi", "top_p": 0}, "top_p"),
    (COMPL, {"prompt": "Hi", "top_p": 1.5}, "top_p"),
    (COMPL, {"prompt": "Hi", "top_k": -2}, "top_k"),
    (COMPL, {"prompt": "Hi", "seed": 2**64}, "seed"),
    (COMPL, {"prompt": "Hi", "stop": 3}, "'stop' must be"),
    (COMPL, {"prompt": "Hi", "stop": ["a", 3]}, "'stop' must be"),
    (COMPL, {"prompt": "Hi", "stop_token_ids": ["a"]}, "stop_token_ids"),
    (COMPL, {"prompt": "Hi", "stop_token_ids": [-1]}, "out of vocabulary"),
    (COMPL, {"prompt": "Hi", "stream": "yes"}, "'stream' must be a boolean"),
    (COMPL, {"prompt": "Hi", "stream_options": {"include_usage": True}}, "Stream options can only be defined"),
    (COMPL, {"prompt": "Hi", "logprobs": -1}, "`logprobs` must be a positive value."),
    (COMPL, {"prompt": "Hi", "echo": "yes"}, "'echo' must be a boolean"),
    (COMPL, {"prompt": "Hi", "model": 7}, "'model' must be a string"),
    (COMPL, [1, 2], "must be a JSON object"),
    (CHAT, {}, "'messages' must be a non-empty list"),
    (CHAT, {"messages": []}, "'messages' must be a non-empty list"),
    (CHAT, {"messages": "Hi"}, "'messages' must be a non-empty list"),
    (CHAT, {"messages": [{"content": "Hi"}]}, "string 'role'"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "content must be a string"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "text"),
    (CHAT, {"messages": [{"role": "wizard", "content": "Hi"}]}, "chat template"),
    (CHAT, {"messages": USER_HI, "max_completion_tokens": 0}, "max_tokens must be at least 1"),
    (CHAT, {"messages": USER_HI, "temperature": None, "top_p": 2}, "top_p"),
]


@pytest.mark.parametrize("path,body,message", BAD_REQUESTS)
async def test_bad_request(served, path, body, message):
    client, engine, _ = served
    before = len(engine.requests)
    _assert_error(await client.post(path, json=body), 400, "BadRequestError", message)
    assert len(engine.requests) == before


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"prompt": "Hi", "temperature": NaN}', b"\xff\xfe",
                                 b"[" * 60_000])
async def test_malformed_json(served, raw):
    client, _, _ = served
    r = await client.post(COMPL, content=raw, headers={"content-type": "application/json"})
    _assert_error(r, 400, "BadRequestError", "not valid JSON")


async def test_unknown_model_is_404(served):
    client, _, _ = served
    err = _assert_error(await client.post(CHAT, json={"model": "gpt-5", "messages": USER_HI}), 404,
                        "NotFoundError")
    assert err["message"] == "The model `gpt-5` does not exist."


async def test_context_length_messages_are_vllms(served):
    client, _, tok = served
    prompt = "x" * 40  # 41 tokens with BOS
    err = _assert_error(await client.post(COMPL, json={"prompt": prompt, "max_tokens": 30}), 400, "BadRequestError")
    assert err["message"] == (
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you requested 71 tokens "
        "(41 in the messages, 30 in the completion). Please reduce the length of the messages or completion.")
    err = _assert_error(await client.post(COMPL, json={"prompt": "x" * 80}), 400, "BadRequestError")
    assert err["message"] == (
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your request has 81 input "
        "tokens. Please reduce the length of the input messages.")
    long_chat = [{"role": "user", "content": "x" * 70}]
    _assert_error(await client.post(CHAT, json={"messages": long_chat}), 400, "BadRequestError",
                  "However, your request has")
    ok = await client.post(COMPL, json={"prompt": "x" * 40, "max_tokens": MAX_MODEL_LEN - 41})
    assert ok.status_code == 200


async def test_body_too_large_is_413(served):
    client, _, _ = served
    r = await client.post(COMPL, json={"prompt": "x" * 100_000})
    _assert_error(r, 413, "RequestEntityTooLargeError")


async def test_unknown_route_and_wrong_method_use_error_shape(served):
    client, _, _ = served
    _assert_error(await client.get("/v1/nothing"), 404, "NotFoundError")
    _assert_error(await client.get(COMPL), 405, "MethodNotAllowedError")


async def test_server_keeps_serving_after_bad_requests(served):
    client, _, _ = served
    r = await client.post(COMPL, json={"prompt": "Hi", "model": MODEL, "frequency_penalty": 0, "user": "u1",
                                       "logprobs": None, "tools": None})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "Hello world"


async def test_long_prompt_is_tokenized_off_the_event_loop():
    app, _, tok = make_app()
    threads = []
    encode = tok.encode
    tok.encode = lambda text, add_special_tokens=True: threads.append(threading.get_ident()) or \
        encode(text, add_special_tokens)
    client = client_for(app)
    _assert_error(await client.post(COMPL, json={"prompt": "x" * 5000}), 400, "BadRequestError",
                  "However, your request has 5001 input tokens")
    assert (await client.post(COMPL, json={"prompt": "Hi", "max_tokens": 1})).status_code == 200
    assert threads[0] != threading.get_ident() and threads[1] == threading.get_ident()


async def test_too_many_logprobs_for_one_request_is_a_400(served, monkeypatch):
    """The volume is bounded so that one request's output always fits in a message between the engine's processes;
    lowered here, where the context is too short to reach the real bound."""
    import tinyvllm.frontend.api.serving as serving
    monkeypatch.setattr(serving, "MAX_LOGPROB_ENTRIES", 300)
    client, engine, _ = served
    before = len(engine.requests)
    echo = {"prompt": "x" * 20, "max_tokens": 10, "logprobs": 5, "echo": True}  # 21 prompt tokens with BOS
    err = _assert_error(await client.post(COMPL, json={**echo, "n": 2}), 400, "BadRequestError")
    assert err["message"] == (
        "This request would return up to 372 logprobs entries (n=2 x (21 prompt tokens x 6 + 10 tokens x 6)), more "
        "than the 300 one request may have. Please ask for fewer logprobs, fewer tokens or a shorter prompt.")
    assert err["param"] == "logprobs"
    chat = {"messages": USER_HI, "logprobs": True, "top_logprobs": 20}  # max_tokens: the rest of the context
    _assert_error(await client.post(CHAT, json=chat), 400, "BadRequestError", "tokens x 21)), more than the 300")
    assert len(engine.requests) == before
    assert (await client.post(COMPL, json=echo)).status_code == 200  # 186 entries
    ranked = _assert_error(await client.post(COMPL, json={"prompt": "Hi", "max_tokens": 40, "best_of": 8}), 400,
                           "BadRequestError", "best_of=8 candidates of up to 40 tokens are 320 tokens to rank")
    assert ranked["param"] == "best_of"
    assert (await client.post(CHAT, json={**chat, "max_tokens": 10})).status_code == 200
