"""Disaggregated prefill/decode across "machines": the router, a `--role prefill` instance and two `--role decode`
instances each in a network namespace of its own (tests/e2e/network_namespaces.py), over tcp through a bridge: the
instances register with the router by their own addresses (with a register secret), the prefill workers' KV side
channel listens on the prefill machine's address (with a KV secret), and a client on the router's machine gets the
greedy answers of a `--role both` instance; both decode instances serve, computing only the last prompt token, and
the prefill instance's blocks are back in its pool afterwards."""
import json
import subprocess
import sys

import httpx
import pytest

from tests.e2e.network_namespaces import Namespaces, cannot_make_namespaces
from tests.e2e.server_process import REQUEST_TIMEOUT_S, STARTUP_TIMEOUT_S, ServerProcess
from tests.router.router_process import RouterProcess

KV_SECRET, REGISTER_SECRET = "netns-kv-secret-0123456789", "netns-register-secret-0123456789"
PROMPTS = [f"Story {i}: the quick brown fox jumps over the lazy dog, and then the dog sleeps in the sun all day long."
           for i in range(4)]  # no common prefix: the router spreads them by load
CLIENT = """
import json, sys, time, httpx
from concurrent.futures import ThreadPoolExecutor
a = json.loads(sys.argv[1])
deadline = time.monotonic() + a["timeout"]
def instances():
    return httpx.get(a["router"] + "/instances", headers={"Authorization": "Bearer " + a["secret"]}).json()["instances"]
while sum(i["state"] == "routable" for i in instances()) < 3:
    assert time.monotonic() < deadline, instances()
    time.sleep(0.2)
def complete(prompt):
    r = httpx.post(a["router"] + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 12,
                                                          "temperature": 0}, timeout=a["timeout"])
    return {"status": r.status_code, "body": r.json()}
with ThreadPoolExecutor(len(a["prompts"])) as pool:
    answers = list(pool.map(complete, a["prompts"]))
def metric(url, name):
    return sum(float(line.split()[-1]) for line in httpx.get(url + "/metrics").text.splitlines()
               if line.startswith(name))
while metric(a["prefill"], "vllm:kv_cache_usage_perc") != 0.0 and time.monotonic() < deadline:
    time.sleep(0.2)
print(json.dumps({"answers": answers, "prefill_usage": metric(a["prefill"], "vllm:kv_cache_usage_perc"),
                  "decode_requests": [metric(url, "vllm:request_success_total") for url in a["decodes"]]}))
"""


@pytest.fixture
def machines():
    if (why := cannot_make_namespaces()) is not None:
        pytest.skip(f"network namespaces cannot be made here: {why}")
    namespaces = Namespaces(4)  # the router's (and the client's), the prefill instance's, two decode instances'
    yield namespaces
    namespaces.close()


def test_prefill_and_decode_on_machines_of_their_own(machines, tiny_model, tmp_path):
    reference = ServerProcess(tiny_model, tmp_path / "both.log", "--block-size", "4")
    router = RouterProcess(tmp_path / "router.log", "--register-secret", REGISTER_SECRET, host=machines.addresses[0],
                           command_prefix=machines.exec_prefix(0))
    instances = []
    try:
        router.wait_ready()
        for index, role in ((1, "prefill"), (2, "decode"), (3, "decode")):
            ip = machines.addresses[index]
            instances.append(ServerProcess(
                tiny_model, tmp_path / f"{role}{index}.log", "--host", ip, "--role", role, "--block-size", "4",
                "--kv-host", ip, "--kv-secret", KV_SECRET, "--register-with", router.url,
                "--register-secret", REGISTER_SECRET, command_prefix=machines.exec_prefix(index)))
        for server in (reference, *instances):
            server.wait_ready(STARTUP_TIMEOUT_S)
        urls = [f"http://{machines.addresses[i]}:{server.port}" for i, server in enumerate(instances, 1)]
        config = {"router": router.url, "prefill": urls[0], "decodes": urls[1:], "timeout": REQUEST_TIMEOUT_S,
                  "prompts": PROMPTS, "secret": REGISTER_SECRET}
        client = subprocess.run([*machines.exec_prefix(0), sys.executable, "-c", CLIENT, json.dumps(config)],
                                capture_output=True, text=True, timeout=2 * REQUEST_TIMEOUT_S + 30)
        assert client.returncode == 0, client.stderr + router.log()[-2000:]
        result = json.loads(client.stdout)
        for prompt, answer in zip(PROMPTS, result["answers"]):
            assert answer["status"] == 200, answer
            assert answer["body"]["choices"][0]["text"] == reference_answer(reference.url, prompt)
            usage = answer["body"]["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
        assert result["prefill_usage"] == 0.0 and all(n > 0 for n in result["decode_requests"]), result
        assert f"KV side channel at tcp://{machines.addresses[1]}:" in instances[0].log(), instances[0].log_tail()
    finally:
        left = {s.log_path.name: s.leftover_description for s in (reference, *instances) if s.stop()}
        router.stop()
    assert not left, f"processes were still running and had to be killed: {left}"


def reference_answer(url: str, prompt: str) -> str:
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 12,
                                                   "temperature": 0}, timeout=REQUEST_TIMEOUT_S, trust_env=False)
    return r.json()["choices"][0]["text"]
