"""Request fields -> SamplingParams (vLLM's names, defaults, clamps and error wording), and the text-side features
that live in the frontend: include_stop_str_in_output and min_tokens' hold on stop strings."""
import pytest

from app_harness import MODEL, parse_sse
from tinyvllm.frontend.api.openai_protocol import APIError, parse_chat_request, parse_completion_request

pytestmark = pytest.mark.anyio
USER_HI = [{"role": "user", "content": "Hi"}]


def test_every_sampling_field_reaches_sampling_params():
    req = parse_completion_request({
        "prompt": "Hi", "max_tokens": 9, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "repetition_penalty": 1.2, "logit_bias": {"7": 150, "8": -3.5}, "min_tokens": 2, "logprobs": 3,
        "echo": True, "include_stop_str_in_output": True, "user": "ignored", "some_future_field": [1]})
    sp = req.sampling
    assert (sp.min_p, sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty) == (0.1, 0.5, -0.5, 1.2)
    assert sp.logit_bias == {7: 100.0, 8: -3.5} and sp.min_tokens == 2
    assert (sp.logprobs, sp.prompt_logprobs) == (3, 3) and req.echo and req.include_stop_str_in_output
    assert not req.is_chat


def test_defaults_ask_for_nothing_extra():
    sp = parse_completion_request({"prompt": "Hi"}).sampling
    assert (sp.min_p, sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty) == (0.0, 0.0, 0.0, 1.0)
    assert (sp.logit_bias, sp.min_tokens, sp.logprobs, sp.prompt_logprobs) == ({}, 0, None, None)


@pytest.mark.parametrize("body, logprobs", [
    ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 5}, 5), ({"logprobs": False}, None),
    ({"logprobs": False, "top_logprobs": 0}, None), ({}, None),
])
def test_chat_logprobs_and_top_logprobs(body, logprobs):
    req = parse_chat_request({"messages": USER_HI, **body})
    assert req.sampling.logprobs == logprobs and req.sampling.prompt_logprobs is None and req.is_chat


def test_max_completion_tokens_wins_over_max_tokens():
    req = parse_chat_request({"messages": USER_HI, "max_tokens": 50, "max_completion_tokens": 7})
    assert req.max_tokens == 7


def test_chat_min_tokens_without_max_tokens_waits_for_the_context_size():
    req = parse_chat_request({"messages": USER_HI, "min_tokens": 30})
    assert req.max_tokens is None and req.sampling.min_tokens == 30


@pytest.mark.parametrize("chat, body, message", [
    (True, {"top_logprobs": 2}, "when using `top_logprobs`, `logprobs` must be set to true."),
    (True, {"logprobs": True, "top_logprobs": -1}, "`top_logprobs` must be a positive value."),
    (True, {"logprobs": True, "top_logprobs": 21}, "Requested sample logprobs of 21, which is greater than max "
                                                    "allowed: 20"),
    (True, {"logprobs": 3}, "'logprobs' must be a boolean"),
    (False, {"logprobs": True}, "'logprobs' must be an integer"),
    (False, {"logprobs": 30}, "greater than max allowed: 20"),
    (False, {"logit_bias": {"x": 1}}, "Found token_id `x` in logit_bias but token_id must be an integer"),
    (False, {"logit_bias": {"5": "big"}}, "logit_bias['5'] must be a finite number"),
    (False, {"logit_bias": [1]}, "'logit_bias' must be an object"),
    (False, {"min_p": 1.5}, "min_p must be in [0, 1]"),
    (False, {"presence_penalty": 3}, "presence_penalty must be in [-2, 2]"),
    (False, {"frequency_penalty": -2.5}, "frequency_penalty must be in [-2, 2]"),
    (False, {"repetition_penalty": 0}, "repetition_penalty must be greater than zero"),
    (False, {"min_tokens": 20, "max_tokens": 5}, "min_tokens must be less than or equal to max_tokens=5"),
    (False, {"min_tokens": -1}, "min_tokens must be greater than or equal to 0"),
    (False, {"include_stop_str_in_output": 1}, "'include_stop_str_in_output' must be a boolean"),
])
def test_bad_fields_are_400s_with_vllm_wording(chat, body, message):
    parse = parse_chat_request if chat else parse_completion_request
    with pytest.raises(APIError) as e:
        parse({"messages": USER_HI, **body} if chat else {"prompt": "Hi", **body})
    assert e.value.status == 400 and message in e.value.message


async def test_out_of_vocab_logit_bias_and_chat_min_tokens_beyond_the_context(served):
    client, engine, tok = served
    r = await client.post("/v1/completions", json={"prompt": "Hi", "logit_bias": {str(tok.vocab_size): 1}})
    assert r.status_code == 400 and "contain out-of-vocab token ids" in r.json()["error"]["message"]
    r = await client.post("/v1/chat/completions", json={"messages": USER_HI, "min_tokens": 10_000})
    assert r.status_code == 400 and "min_tokens must be less than or equal to max_tokens" in r.json()["error"]["message"]
    assert not engine.requests


async def test_sampling_fields_reach_the_engine(served):
    client, engine, _ = served
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": USER_HI, "max_completion_tokens": 5, "presence_penalty": 1, "min_tokens": 2,
        "logit_bias": {"70": 2}, "repetition_penalty": 1.1, "min_p": 0.05})
    sp = engine.requests[r.json()["id"]].sampling
    assert (sp.max_tokens, sp.presence_penalty, sp.min_tokens, sp.logit_bias, sp.repetition_penalty, sp.min_p) == \
        (5, 1.0, 2, {70: 2.0}, 1.1, 0.05)


@pytest.mark.parametrize("include, text", [(False, "Hello "), (True, "Hello wor")])
async def test_include_stop_str_in_output(served, include, text):
    client, _, _ = served
    body = {"prompt": "Hi", "stop": "wor", "include_stop_str_in_output": include}
    choice = (await client.post("/v1/completions", json=body)).json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (text, "stop", "wor")
    events = parse_sse((await client.post("/v1/completions", json={**body, "stream": True})).text)
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == text


@pytest.mark.parametrize("min_tokens, text", [(0, "He"), (3, "Hel"), (12, "Hello world")])
async def test_stop_strings_wait_for_min_tokens(served, min_tokens, text):
    client, _, _ = served
    body = {"prompt": "Hi", "stop": "l", "min_tokens": min_tokens, "max_tokens": 12}
    choice = (await client.post("/v1/completions", json=body)).json()["choices"][0]
    assert choice["text"] == text
    assert choice["stop_reason"] == ("l" if min_tokens < 12 else None)
