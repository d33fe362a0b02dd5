"""Disaggregated prefill/decode through real processes: a router, one `--role prefill` instance and two `--role
decode` instances (sharing a --kv-secret), and a `--role both` instance for reference. Greedy outputs through the
router equal the reference's; decode instances compute only each prompt's last token (the rest are cached tokens);
the prefill instance's blocks all come back to its pool. A decode instance joining under load gets requests within
5 s, and draining it loses none. Two more routers find the instances by DNS, with no registration, and either
serves; one killed mid-stream loses only its own stream. A decode instance killed mid-stream: its client gets an explicit error, the router
drops it within the heartbeat timeout, new requests succeed, and KV no one pulled comes back within the lease. A
prefill instance killed between prefill and transfer: the decode side fails that request at once, and leaks nothing.
"""
from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.http_helpers import completion_body, stream
from tests.e2e.server_process import MODEL_NAME, STARTUP_TIMEOUT_S, ServerProcess, read_metric, wait_until
from tests.helpers.tiny_model import make_tiny_gguf
from tests.router.router_process import RouterProcess, SteadyLoad, kill_mid_stream, since

PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog sleeps in the sun all day long."
KV_SECRET = "pd-test-kv-secret-0123456789"
LEASE_S = 10.0
HEARTBEAT_TIMEOUT_S, JOIN_DEADLINE_S, POLL_SLACK_S = 6.0, 5.0, 1.5
PD_ARGS = ("--block-size", "4", "--num-kv-blocks", "480", "--kv-secret", KV_SECRET)  # 1,920 tokens: a long stream fits


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """Wide enough that a step takes milliseconds: a long stream still runs when the test kills its instance."""
    return make_tiny_gguf(tmp_path_factory.mktemp("model") / "wide.gguf", dim=512, n_heads=8, n_kv_heads=4, ffn=1024,
                          context=2048)


def complete(url: str, prompt: str = PROMPT, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": prompt, "temperature": 0, **body},
                   timeout=240, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()


def idle_pool(url: str) -> bool:
    return read_metric(url, "vllm:kv_cache_usage_perc") == 0.0


def routable(router: RouterProcess, url: str) -> bool:
    return router.instances().get(url, {}).get("state") == "routable"


@pytest.fixture(scope="module")
def pd(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pd")
    router = RouterProcess(folder / "router.log")
    servers: dict[str, ServerProcess] = {}

    def start(name: str, *args: str) -> ServerProcess:
        servers[name] = ServerProcess(tiny_model, folder / f"{name}.log", *args)
        return servers[name]
    try:
        router.wait_ready()
        start("both", "--block-size", "4")
        start("prefill", "--role", "prefill", "--kv-lease-seconds", str(LEASE_S), *PD_ARGS, "--register-with", router.url)
        for name in ("decode0", "decode1"):
            start(name, "--role", "decode", *PD_ARGS, "--register-with", router.url)
        for server in servers.values():
            server.wait_ready(STARTUP_TIMEOUT_S)
        assert wait_until(lambda: sum(row["state"] == "routable" for row in router.instances().values()) == 3, 30)
        servers["start"] = start  # more decode instances, later
        yield router, servers
    finally:
        left = {name: s.leftover_description for name, s in servers.items() if name != "start" and s.stop()}
        router.stop()
        assert not left, f"processes were still running and had to be killed: {left}"


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

    answer = complete(servers["decode0"].url, max_tokens=12, kv_transfer_params=kv)
    assert answer["choices"][0]["text"] == reference["choices"][0]["text"]
    assert answer["usage"]["prompt_tokens"] == num_prompt
    # the decode instance computed only the last prompt token: the others' KV came from the prefill instance
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == num_prompt - 1
    assert wait_until(lambda: idle_pool(servers["prefill"].url), 30), "the lease was not released"
    assert wait_until(lambda: idle_pool(servers["decode0"].url), 30)
    again = httpx.post(servers["decode1"].url + "/v1/completions", json={
        "model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": kv}, timeout=60, trust_env=False)
    assert again.status_code == 500 and "no lease on these blocks" in again.text  # taken once, never again


def test_the_router_pairs_prefill_and_decode(pd):
    router, servers = pd
    prompts = [f"Story {i}: {PROMPT}" for i in range(4)]  # no common prefix: load decides where they go
    references = [complete(servers["both"].url, p, max_tokens=10)["choices"][0]["text"] for p in prompts]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda p: complete(router.url, p, max_tokens=10), prompts))
    assert [a["choices"][0]["text"] for a in answers] == references
    for a in answers:
        assert "kv_transfer_params" not in a
        assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == a["usage"]["prompt_tokens"] - 1
    streamed = stream(router.url, "/v1/completions", {"model": MODEL_NAME, "prompt": prompts[0], "temperature": 0,
                                                       "max_tokens": 10})
    assert streamed.status == 200 and streamed.text == references[0]
    assert router.routed_to(servers["prefill"].url) >= 5
    assert router.routed_to(servers["decode0"].url) > 0 and router.routed_to(servers["decode1"].url) > 0
    for name in ("prefill", "decode0", "decode1"):
        assert wait_until(lambda: idle_pool(servers[name].url), 30), name


def test_two_routers_find_prefill_and_decode_by_dns_and_losing_one_loses_only_its_streams(pd, tmp_path):
    """No registration: each router resolves a name per role (`localhost`, the names of headless Services on
    Kubernetes) to its prefill and decode instances. Either router serves every request; a router killed mid-stream
    ends its client's stream (an error, not a hang) while the other serves on, and the instances free every block."""
    _, servers = pd
    prefill, decode = servers["prefill"], servers["decode0"]
    dns = ("--discover-prefill-dns", f"localhost:{prefill.port}", "--discover-decode-dns", f"localhost:{decode.port}",
           "--discover-interval", "1")
    routers = [RouterProcess(tmp_path / f"router{i}.log", *dns) for i in range(2)]
    try:
        for router in routers:
            router.wait_ready()
        for router in routers:
            assert wait_until(lambda: routable(router, prefill.url) and routable(router, decode.url), 30), \
                router.instances()
            assert {row["source"] for row in router.instances().values()} == {"dns"}
            assert {row["role"] for url, row in router.instances().items() if routable(router, url)} == \
                {"prefill", "decode"}
        reference = complete(servers["both"].url, max_tokens=10)["choices"][0]["text"]
        for router in routers:
            answer = complete(router.url, max_tokens=10)
            assert answer["choices"][0]["text"] == reference
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == answer["usage"]["prompt_tokens"] - 1

        body = {"model": MODEL_NAME, "prompt": PROMPT, "temperature": 0, "max_tokens": 400, "ignore_eos": True}
        with ThreadPoolExecutor(1) as pool:
            cut = pool.submit(stream, routers[0].url, "/v1/completions", body)
            assert wait_until(lambda: read_metric(decode.url, "vllm:num_requests_running") >= 1, 60)
            os.kill(routers[0].proc.pid, signal.SIGKILL)
            try:  # it ends, in an error (the connection broke), never as if it were complete, and never hangs
                assert not cut.result(timeout=60).done, "the stream through the killed router ended as if complete"
            except httpx.HTTPError:
                pass
        assert complete(routers[1].url, max_tokens=10)["choices"][0]["text"] == reference
        for server in (prefill, decode):
            assert wait_until(lambda: idle_pool(server.url), 30), server.log_tail()
    finally:
        for router in routers:
            router.stop()


def test_a_decode_whose_prefill_is_gone_fails_explicitly(pd):
    _, servers = pd
    decode = servers["decode0"].url
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


def test_a_decode_instance_joining_under_load_gets_requests_and_draining_it_loses_none(pd):
    router, servers = pd
    load = SteadyLoad(router.url)
    try:
        load.wait_for(3)
        joining = servers["start"]("decode2", "--role", "decode", *PD_ARGS, "--register-with", router.url)
        joining.wait_ready(STARTUP_TIMEOUT_S)
        ready_at = time.monotonic()
        assert wait_until(lambda: router.routed_to(joining.url) > 0, JOIN_DEADLINE_S + POLL_SLACK_S), \
            (since(ready_at), router.instances())
        load.wait_for(3)
        reply = httpx.post(router.url + "/instances/drain", json={"url": joining.url}, timeout=30, trust_env=False)
        assert reply.status_code == 200, reply.text
        assert wait_until(lambda: joining.url not in router.instances(), 120), router.instances()
        routed = router.routed_to(joining.url)
        load.wait_for(6)
        assert router.routed_to(joining.url) == routed  # nothing new went there once drained
    finally:
        load.stop()
    assert load.failures == [], load.failures
    assert joining.stop() == []


def test_a_decode_instance_killed_mid_stream(pd):
    router, servers = pd
    decodes = [servers["decode0"], servers["decode1"]]
    victim, killed_at, rest = kill_mid_stream(router, decodes)
    assert len(rest) >= 2 and rest[-1] == "data: [DONE]" and '"error"' in rest[-2], rest[-3:]

    survivor = next(d for d in decodes if d is not victim)
    for i in range(3):  # at once: a refused connection moves them to the survivor
        assert complete(router.url, f"After {i}:", max_tokens=4)["choices"][0]["text"]
    assert wait_until(lambda: victim.url not in router.instances(), HEARTBEAT_TIMEOUT_S + POLL_SLACK_S
                      - since(killed_at)), (since(killed_at), router.instances())
    assert routable(router, survivor.url)

    # KV that no decode instance pulls (its decode died before it could) comes back within the lease
    prefill = servers["prefill"].url
    assert wait_until(lambda: idle_pool(prefill), 30)
    complete(prefill, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    leased_at = time.monotonic()
    assert not idle_pool(prefill)
    assert wait_until(lambda: idle_pool(prefill), LEASE_S + 5), since(leased_at)
    assert since(leased_at) >= LEASE_S - 1


def test_a_prefill_instance_killed_between_prefill_and_transfer(pd):
    """Last: it kills the prefill instance."""
    router, servers = pd
    prefill = servers["prefill"]
    decode = next(d for d in (servers["decode0"], servers["decode1"]) if d.proc.poll() is None)  # the survivor
    kv = complete(prefill.url, max_tokens=1, kv_transfer_params={"do_remote_decode": True})["kv_transfer_params"]
    prefill.snapshot()
    os.killpg(prefill.pid, signal.SIGKILL)  # the server and its engine: nothing serves the blocks any more
    r = httpx.post(decode.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4,
                                                         "kv_transfer_params": kv}, timeout=120, trust_env=False)
    # at once (the connection is refused), not after the pull timeout
    assert r.status_code == 500 and "nothing listens there" in r.json()["error"]["message"], r.text
    assert wait_until(lambda: idle_pool(decode.url), 30)
    assert wait_until(lambda: prefill.url not in router.instances(), HEARTBEAT_TIMEOUT_S + POLL_SLACK_S)
