"""Disaggregated prefill/decode through real processes: a `--role prefill` instance computes the prompt and leases its
KV blocks, a `--role decode` instance pulls them over the workers' KV side channel and decodes. Greedy outputs equal
one `--role both` instance's, the decode instance computed only the prompt's last token (the rest are its cached
tokens), the prefill instance's blocks are all back in its pool afterwards; the router pairs the two by their
heartbeats' roles; a decode whose prefill is gone fails with an explicit error."""
from __future__ import annotations

import os

import httpx
import pytest

from tests.e2e.http_helpers import stream
from tests.e2e.server_process import MODEL_NAME, STARTUP_TIMEOUT_S, ServerProcess, read_metric, wait_until
from tests.router.router_process import RouterProcess

PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog sleeps in the sun all day long."
PULL_TIMEOUT_S = "10"  # the decode workers' wait for a prefill worker that does not answer


def complete(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPT, "temperature": 0, **body},
                   timeout=240, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def pd(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pd")
    router = RouterProcess(folder / "router.log")
    servers: dict[str, ServerProcess] = {}
    old = os.environ.get("TINYVLLM_KV_PULL_TIMEOUT_S")
    os.environ["TINYVLLM_KV_PULL_TIMEOUT_S"] = PULL_TIMEOUT_S
    try:
        router.wait_ready()
        servers["both"] = ServerProcess(tiny_model, folder / "both.log", "--block-size", "4")
        for role in ("prefill", "decode"):
            servers[role] = ServerProcess(tiny_model, folder / f"{role}.log", "--role", role, "--block-size", "4",
                                          "--register-with", router.url)
        for server in servers.values():
            server.wait_ready(STARTUP_TIMEOUT_S)
        assert wait_until(lambda: sum(row["state"] == "routable" for row in router.instances().values()) == 2, 30)
        yield router, servers
    finally:
        os.environ.pop("TINYVLLM_KV_PULL_TIMEOUT_S") if old is None else os.environ.update(
            TINYVLLM_KV_PULL_TIMEOUT_S=old)
        left = {name: s.leftover_description for name, s in servers.items() if s.stop()}
        router.stop()
        assert not left, f"processes were still running and had to be killed: {left}"


def idle_pool(url: str) -> bool:
    return read_metric(url, "vllm:kv_cache_usage_perc") == 0.0


def test_prefill_then_decode_equals_one_instance(pd):
    _, servers = pd
    reference = complete(servers["both"].url, max_tokens=12)
    first = complete(servers["prefill"].url, max_tokens=1,
                     kv_transfer_params={"do_remote_decode": True, "unknown_key": 1})
    kv = first["kv_transfer_params"]
    num_prompt = first["usage"]["prompt_tokens"]
    assert kv["do_remote_prefill"] and not kv["do_remote_decode"] and kv["remote_host"] == "127.0.0.1"
    assert len(kv["remote_block_ids"]) == -(-(num_prompt - 1) // 4) and kv["tp_size"] == 1
    assert not idle_pool(servers["prefill"].url)  # leased until the decode instance pulls the blocks

    answer = complete(servers["decode"].url, max_tokens=12, kv_transfer_params=kv)
    assert answer["choices"][0]["text"] == reference["choices"][0]["text"]
    assert answer["usage"]["prompt_tokens"] == num_prompt
    # the decode instance computed only the last prompt token: the others' KV came from the prefill instance
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == num_prompt - 1
    assert wait_until(lambda: idle_pool(servers["prefill"].url), 30), "the lease was not released"
    assert wait_until(lambda: idle_pool(servers["decode"].url), 30)


def test_the_router_pairs_prefill_and_decode(pd):
    router, servers = pd
    reference = complete(servers["both"].url, max_tokens=10)["choices"][0]["text"]
    through = complete(router.url, max_tokens=10)
    assert through["choices"][0]["text"] == reference and "kv_transfer_params" not in through
    streamed = stream(router.url, "/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "temperature": 0,
                                                       "max_tokens": 10})
    assert streamed.status == 200 and streamed.text == reference
    assert read_metric(router.url, "tinyvllm_router:routing_decisions_total",
                       f'instance="{servers["prefill"].url}"') >= 1
    assert wait_until(lambda: idle_pool(servers["prefill"].url), 30)


def test_a_decode_whose_prefill_is_gone_fails_explicitly(pd):
    _, servers = pd
    decode = servers["decode"].url
    count = httpx.post(decode + "/tokenize", json={"model": MODEL_NAME, "prompt": PROMPT}, timeout=60).json()["count"]
    gone = {"do_remote_prefill": True, "remote_block_ids": list(range(-(-(count - 1) // 4))), "remote_host": "127.0.0.1",
            "remote_port": 9, "remote_request_id": "cmpl-x", "remote_engine_id": "e", "tp_size": 1}
    r = httpx.post(decode + "/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4,
                                                     "kv_transfer_params": gone}, timeout=120, trust_env=False)
    assert r.status_code == 500, r.text
    assert "pulling the prompt's KV failed: no answer from the prefill worker" in r.json()["error"]["message"]
    assert wait_until(lambda: idle_pool(decode), 30)


def test_do_remote_decode_needs_a_prefill_instance(pd):
    _, servers = pd
    r = httpx.post(servers["both"].url + "/v1/completions", json={
        "model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}},
        timeout=60, trust_env=False)
    assert r.status_code == 400 and "side channel" in r.text
