"""Prefill and decode instances with different tensor-parallel sizes, through real processes: a `-tp 2` prefill
instance feeds a `-tp 1` decode instance and a `-tp 1` prefill instance feeds a `-tp 2` decode instance (each decode
rank pulls the KV heads it holds from the prefill ranks that hold them); greedy answers equal a `--role both`
instance's, the decode side computes only the last prompt token, and every prefill block comes back."""
import socket

import httpx
import pytest

from tests.e2e.server_process import MODEL_NAME, STARTUP_TIMEOUT_S, ServerProcess, free_port, read_metric, wait_until

PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog sleeps in the sun all day long."
ARGS = ("--block-size", "4", "--kv-secret", "tp-e2e-kv-secret-0123456789")


def two_free_ports() -> int:
    """A port p with p + 1 free too (a -tp 2 prefill engine's ranks serve at --kv-port + rank)."""
    while True:
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


def complete(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPT, "temperature": 0, **body},
                   timeout=240, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def servers(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pd-tp")
    specs = {"both": ("--block-size", "4"),
             "prefill_tp2": ("--role", "prefill", "-tp", "2", "--kv-port", str(two_free_ports()), *ARGS),
             "prefill_tp1": ("--role", "prefill", *ARGS),
             "decode_tp1": ("--role", "decode", *ARGS),
             "decode_tp2": ("--role", "decode", "-tp", "2", *ARGS)}
    started = {name: ServerProcess(tiny_model, folder / f"{name}.log", *args) for name, args in specs.items()}
    try:
        for server in started.values():
            server.wait_ready(STARTUP_TIMEOUT_S)
        yield started
    finally:
        left = {name: s.leftover_description for name, s in started.items() if s.stop()}
        assert not left, f"processes were still running and had to be killed: {left}"


@pytest.mark.parametrize("prefill, decode", [("prefill_tp2", "decode_tp1"), ("prefill_tp1", "decode_tp2")])
def test_different_tensor_parallel_sizes(servers, prefill, decode):
    reference = complete(servers["both"].url, max_tokens=12)["choices"][0]["text"]
    first = complete(servers[prefill].url, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    answer = complete(servers[decode].url, max_tokens=12, kv_transfer_params=first["kv_transfer_params"])
    assert answer["choices"][0]["text"] == reference
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == answer["usage"]["prompt_tokens"] - 1
    assert wait_until(lambda: read_metric(servers[prefill].url, "vllm:kv_cache_usage_perc") == 0.0, 30)
