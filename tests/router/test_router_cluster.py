"""A `tinyvllm router` and real `tinyvllm serve` instances joining it with --register-with: greedy answers through
the router equal direct ones; an instance started under load gets requests within 5 s, and draining it (from the
router, or by stopping the instance) loses none; an instance killed with SIGKILL mid-stream gives that client an
explicit error, leaves the router within the heartbeat timeout, and new requests succeed on the other at once."""
from __future__ import annotations

import json
import re
import signal
import time
from dataclasses import dataclass, field

import httpx
import pytest

from tests.e2e.http_helpers import chat_body, complete, completion_body, stream
from tests.e2e.server_process import (REQUEST_TIMEOUT_S, STARTUP_TIMEOUT_S, ServerProcess, metrics_text, read_metric,
                                     wait_until)
from tests.helpers.tiny_model import make_tiny_gguf
from tests.router.router_process import RouterProcess, SteadyLoad, kill_mid_stream, since

HEARTBEAT_TIMEOUT_S = 6.0  # the router's default
JOIN_DEADLINE_S = 5.0
POLL_SLACK_S = 1.5  # a sweep (0.5 s) and a poll of /instances on a busy machine


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """Wide enough that a step takes milliseconds, so a long stream is still running when the test kills its
    instance (as tests/e2e/test_data_parallel.py's)."""
    return make_tiny_gguf(tmp_path_factory.mktemp("model") / "wide.gguf", dim=512, n_heads=8, n_kv_heads=4, ffn=1024,
                          context=2048)


@dataclass
class Cluster:
    router: RouterProcess
    model: object
    folder: object
    instances: list[ServerProcess] = field(default_factory=list)

    def start_instances(self, count: int) -> list[ServerProcess]:
        """`count` instances registering with the router, started at once; returned when the router routes to
        them."""
        names = [f"instance{len(self.instances) + i}" for i in range(count)]
        new = [ServerProcess(self.model, self.folder / f"{name}.log", "--register-with", self.router.url,
                             "--num-kv-blocks", "128",  # 2,048 tokens: a long stream fits
                             "--kv-events-config", json.dumps({"enable_kv_cache_events": True,
                                                               "endpoint": f"ipc://{self.folder}/{name}.kv"}))
               for name in names]
        self.instances += new
        for instance in new:
            instance.wait_ready(STARTUP_TIMEOUT_S)
        return new

    def routable(self, instance: ServerProcess) -> bool:
        return self.router.instances().get(instance.url, {}).get("state") == "routable"


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster")
    router = RouterProcess(folder / "router.log")
    cluster = Cluster(router, tiny_model, folder)
    try:
        router.wait_ready()
        for instance in cluster.start_instances(2):
            assert wait_until(lambda: cluster.routable(instance), JOIN_DEADLINE_S), router.instances()
        yield cluster
    finally:
        leftovers = {i.log_path.name: i.leftover_description for i in cluster.instances if i.stop()}
        assert router.stop() == 0, router.log()[-3000:]
        assert not leftovers, f"processes were still running after the tests and had to be killed: {leftovers}"


def test_greedy_answers_through_the_router_equal_direct_ones(cluster):
    router, direct = cluster.router, cluster.instances[0]
    for prompt in ("The capital of France is", "Once upon a time"):
        body = completion_body(prompt, max_tokens=12, temperature=0)
        expected = complete(direct.url, "/v1/completions", body)
        for _ in range(2):  # short prompts (no cached prefix to follow): idle instances take turns
            assert complete(router.url, "/v1/completions", body) == expected
    chat = chat_body("Say something.", max_tokens=10, temperature=0)
    streamed = stream(router.url, "/v1/chat/completions", chat)
    assert streamed.done and not streamed.errors
    assert streamed.text == complete(direct.url, "/v1/chat/completions", chat)[0]
    ollama = {"model": "tiny", "prompt": "Hello", "stream": False, "options": {"temperature": 0, "num_predict": 8}}
    through = httpx.post(router.url + "/api/generate", json=ollama, timeout=REQUEST_TIMEOUT_S, trust_env=False)
    assert through.json()["response"] == httpx.post(direct.url + "/api/generate", json=ollama,
                                                     timeout=REQUEST_TIMEOUT_S).json()["response"]
    # Idle instances take turns. (The direct requests above, between the routed ones, can leave instance 0 looking
    # busier in the router's last report on a loaded machine, so each routed one went to instance 1: more requests
    # through the router alone, one after another, until both have had one.)
    for i in range(8):
        if all(router.routed_to(x.url) > 0 for x in cluster.instances):
            break
        complete(router.url, "/v1/completions", completion_body(f"Turn {i}:", max_tokens=1, temperature=0))
    assert all(router.routed_to(x.url) > 0 for x in cluster.instances), [router.routed_to(x.url)
                                                                         for x in cluster.instances]


def known_blocks(router: RouterProcess) -> dict[str, float]:
    """tinyvllm_router:kv_event_blocks by instance: the instances whose KV events the router follows."""
    pattern = r'^tinyvllm_router:kv_event_blocks\{instance="([^"]+)"\} (\S+)$'
    return {url: float(value) for url, value in re.findall(pattern, metrics_text(router.url), re.MULTILINE)}


def test_routers_following_the_instances_kv_events_send_a_prompt_where_another_router_cached_it(cluster):
    """With --tokenizer, each router follows every instance's GET /kv_events: a long prompt that router A sent to
    one instance is sent to the same instance by router B, which never saw it, for its cached prefix."""
    urls = [i.url for i in cluster.instances]
    a, b = (RouterProcess(cluster.folder / f"follower{i}.log", "--instances", *urls, "--tokenizer", str(cluster.model))
            for i in range(2))
    try:
        for router in (a, b):
            router.wait_ready()
            assert wait_until(lambda: set(known_blocks(router)) == set(urls), 30), router.log()[-3000:]
        text = "A prompt long enough to fill several blocks of the instances' KV cache, routed once. " * 8
        complete(a.url, "/v1/completions", completion_body(text, max_tokens=1, temperature=0))
        (holder,) = [url for url in urls if a.routed_to(url) > 0]
        assert wait_until(lambda: known_blocks(b)[holder] >= 8, 30), known_blocks(b)
        complete(b.url, "/v1/completions", completion_body(text + "And once more.", max_tokens=1, temperature=0))
        assert read_metric(b.url, "tinyvllm_router:routing_decisions_total", f'instance="{holder}",reason="cache"') == 1
        assert wait_until(lambda: known_blocks(a)[holder] == known_blocks(b)[holder], 30), (known_blocks(a),
                                                                                             known_blocks(b))
    finally:
        codes = [router.stop() for router in (a, b)]
    assert codes == [0, 0]


def test_an_instance_joining_under_load_gets_requests_and_draining_it_loses_none(cluster):
    router = cluster.router
    load = SteadyLoad(router.url)
    try:
        load.wait_for(3)
        (joining,) = cluster.start_instances(1)
        ready_at = time.monotonic()
        assert wait_until(lambda: router.routed_to(joining.url) > 0, JOIN_DEADLINE_S + POLL_SLACK_S), \
            (since(ready_at), router.instances())
        load.wait_for(3)
        reply = httpx.post(router.url + "/instances/drain", json={"url": joining.url}, timeout=30, trust_env=False)
        assert reply.status_code == 200, reply.text
        routed = router.routed_to(joining.url)
        assert wait_until(lambda: joining.url not in router.instances(), REQUEST_TIMEOUT_S), router.instances()
        load.wait_for(6)
        assert router.routed_to(joining.url) == routed  # nothing new went there once drained
    finally:
        load.stop()
    assert load.failures == [], load.failures
    assert joining.stop() == []


def test_an_instance_stopped_under_load_drains_leaves_and_loses_nothing(cluster):
    router = cluster.router
    load = SteadyLoad(router.url)
    try:
        (leaving,) = cluster.start_instances(1)
        assert wait_until(lambda: router.routed_to(leaving.url) > 0, REQUEST_TIMEOUT_S), router.instances()
        assert leaving.signal_and_wait(signal.SIGTERM, 60) is not None, leaving.log_tail()
        assert leaving.url not in router.instances()  # it deregistered once its drain was over
        load.wait_for(6)
    finally:
        load.stop()
    assert load.failures == [], load.failures
    assert leaving.proc.returncode == 0 and "deregister" not in leaving.log(), leaving.log_tail()


def test_an_instance_killed_mid_stream(cluster):
    router = cluster.router
    victim, killed_at, rest = kill_mid_stream(router, cluster.instances)
    assert len(rest) >= 2 and rest[-1] == "data: [DONE]", rest[-3:]
    assert '"error"' in rest[-2] and "failed mid-answer" in rest[-2], rest[-3:]
    broken = read_metric(router.url, "tinyvllm_router:errors_total", f'instance="{victim.url}",reason="broken_stream"')
    assert broken == 1

    survivor = next(i for i in cluster.instances if i is not victim and i.proc.poll() is None)
    for i in range(3):  # at once, before the victim's heartbeats expire: a refused connection moves them
        assert complete(router.url, "/v1/completions", completion_body(f"After {i}:", max_tokens=4))[1]
    assert wait_until(lambda: victim.url not in router.instances(), HEARTBEAT_TIMEOUT_S + POLL_SLACK_S
                      - since(killed_at)), (since(killed_at), router.instances())
    assert cluster.routable(survivor)
