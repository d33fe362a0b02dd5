"""The router's prefill/decode pairing (frontend/router/disaggregation.py) against scripted upstreams: the prefill
instance gets a one-token, non-streaming copy asking do_remote_decode; the decode instance gets the original request
plus the kv_transfer_params the prefill instance answered, and its stream reaches the client; a failed prefill answer
goes back as it came."""
import json

import httpx
import pytest

from tests.router.harness import WAIT_S, RawUpstream, running_router

pytestmark = pytest.mark.anyio

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "stream": True, "max_tokens": 7,
        "min_tokens": 2, "stream_options": {"include_usage": True}}
KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [3, 4], "remote_engine_id": "e",
      "remote_host": "10.0.0.5", "remote_port": 5600, "remote_request_id": "chatcmpl-1", "tp_size": 1}
STREAM = b'data: {"n":1}\n\ndata: [DONE]\n\n'


async def test_prefill_then_decode():
    async def prefill(exchange):
        await exchange.whole(200, json.dumps({"choices": [], "kv_transfer_params": KV}).encode())

    async def decode(exchange):
        await exchange.start()
        await exchange.chunk(STREAM)
        await exchange.end()

    async with RawUpstream(prefill) as p, RawUpstream(decode) as d, \
            running_router({p.url: 0, d.url: 0}) as router, httpx.AsyncClient(timeout=WAIT_S, trust_env=False) as c:
        router.registry.get(p.url).role, router.registry.get(d.url).role = "prefill", "decode"
        response = await c.post(router.url + "/v1/chat/completions", json=CHAT)
        assert response.status_code == 200 and response.content == STREAM
        sent_to_prefill = json.loads(p.exchanges[0].body)
        assert sent_to_prefill == {"model": "tiny", "messages": CHAT["messages"], "stream": False, "max_tokens": 1,
                                   "kv_transfer_params": {"do_remote_decode": True}}
        assert json.loads(d.exchanges[0].body) == {**CHAT, "kv_transfer_params": KV}
        assert len(p.exchanges) == len(d.exchanges) == 1


async def test_a_failed_prefill_goes_back_as_it_came():
    async def prefill(exchange):
        await exchange.whole(400, b'{"error": {"message": "prompt too long"}}')

    async def decode(exchange):
        raise AssertionError("the decode instance must not be asked")

    async with RawUpstream(prefill) as p, RawUpstream(decode) as d, \
            running_router({p.url: 0, d.url: 0}) as router, httpx.AsyncClient(timeout=WAIT_S, trust_env=False) as c:
        router.registry.get(p.url).role, router.registry.get(d.url).role = "prefill", "decode"
        response = await c.post(router.url + "/v1/completions", json={"model": "tiny", "prompt": "x"})
        assert response.status_code == 400 and response.json()["error"]["message"] == "prompt too long"
        assert not d.exchanges


def test_what_goes_prefill_then_decode():
    from tinyvllm.frontend.router.disaggregation import parse_body
    assert parse_body(json.dumps({**CHAT, "kv_transfer_params": KV}).encode()) == CHAT  # the client's are dropped
    for whole in ({"n": 2}, {"prompt_logprobs": 1}, {"echo": True, "logprobs": 2}):  # one instance serves these
        assert parse_body(json.dumps({**CHAT, **whole}).encode()) is None
    assert parse_body(b"[1, 2]") is None and parse_body(b"{") is None
