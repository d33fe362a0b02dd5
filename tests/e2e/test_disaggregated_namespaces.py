"""Disaggregated prefill/decode across "machines": the router, a `--role prefill` instance and a `--role decode`
instance each in a network namespace of its own (tests/e2e/network_namespaces.py), over tcp through a bridge: the
instances register with the router by their own addresses (with a register secret), the prefill workers' KV side
channel listens on the prefill machine's address (with a KV secret), and a client on the router's machine gets the
greedy answer of a `--role both` instance; the decode instance computed only the last prompt token, and the prefill
instance's blocks are back in its pool afterwards."""
import json
import subprocess
import sys

import pytest

from tests.e2e.network_namespaces import Namespaces, cannot_make_namespaces
from tests.e2e.server_process import REQUEST_TIMEOUT_S, STARTUP_TIMEOUT_S, ServerProcess
from tests.router.router_process import RouterProcess

KV_SECRET, REGISTER_SECRET = "netns-kv-secret-0123456789", "netns-register-secret-0123456789"
PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog sleeps in the sun all day long."
CLIENT = """
import json, sys, time, httpx
router, prefill, timeout, secret = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[5]
deadline = time.monotonic() + timeout
def instances():
    return httpx.get(router + "/instances", headers={"Authorization": "Bearer " + secret}).json()["instances"]
while sum(i["state"] == "routable" for i in instances()) < 2:
    assert time.monotonic() < deadline, instances()
    time.sleep(0.2)
r = httpx.post(router + "/v1/completions", json={"model": "tiny", "prompt": sys.argv[4], "max_tokens": 12,
                                                  "temperature": 0}, timeout=timeout)
def usage():
    for line in httpx.get(prefill + "/metrics").text.splitlines():
        if line.startswith("vllm:kv_cache_usage_perc"):
            return float(line.split()[-1])
while usage() != 0.0 and time.monotonic() < deadline:
    time.sleep(0.2)
print(json.dumps({"status": r.status_code, "body": r.json(), "prefill_usage": usage()}))
"""


@pytest.fixture
def machines():
    if (why := cannot_make_namespaces()) is not None:
        pytest.skip(f"network namespaces cannot be made here: {why}")
    namespaces = Namespaces(3)  # the router's (and the client's), the prefill instance's, the decode instance's
    yield namespaces
    namespaces.close()


def test_prefill_and_decode_on_machines_of_their_own(machines, tiny_model, tmp_path):
    reference = ServerProcess(tiny_model, tmp_path / "both.log", "--block-size", "4")
    router = RouterProcess(tmp_path / "router.log", "--register-secret", REGISTER_SECRET, host=machines.addresses[0],
                           command_prefix=machines.exec_prefix(0))
    instances = []
    try:
        router.wait_ready()
        for index, role in ((1, "prefill"), (2, "decode")):
            ip = machines.addresses[index]
            instances.append(ServerProcess(
                tiny_model, tmp_path / f"{role}.log", "--host", ip, "--role", role, "--block-size", "4",
                "--kv-host", ip, "--kv-secret", KV_SECRET, "--register-with", router.url,
                "--register-secret", REGISTER_SECRET, command_prefix=machines.exec_prefix(index)))
        for server in (reference, *instances):
            server.wait_ready(STARTUP_TIMEOUT_S)
        prefill_url = f"http://{machines.addresses[1]}:{instances[0].port}"
        client = subprocess.run([*machines.exec_prefix(0), sys.executable, "-c", CLIENT, router.url, prefill_url,
                                 str(REQUEST_TIMEOUT_S), PROMPT, REGISTER_SECRET], capture_output=True, text=True,
                                timeout=2 * REQUEST_TIMEOUT_S + 30)
        assert client.returncode == 0, client.stderr + router.log()[-2000:]
        answer = json.loads(client.stdout)
        assert answer["status"] == 200, answer
        expected = reference_answer(reference.url)
        assert answer["body"]["choices"][0]["text"] == expected
        usage = answer["body"]["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
        assert answer["prefill_usage"] == 0.0
        assert f"KV side channel at tcp://{machines.addresses[1]}:" in instances[0].log(), instances[0].log_tail()
    finally:
        left = {s.log_path.name: s.leftover_description for s in (reference, *instances) if s.stop()}
        router.stop()
    assert not left, f"processes were still running and had to be killed: {left}"


def reference_answer(url: str) -> str:
    import httpx
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 12,
                                                   "temperature": 0}, timeout=REQUEST_TIMEOUT_S, trust_env=False)
    return r.json()["choices"][0]["text"]
