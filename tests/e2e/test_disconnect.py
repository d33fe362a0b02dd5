"""A client that goes away mid-stream (a real socket closed by httpx) aborts its request: the engine stops
running it and frees its KV blocks within seconds, with the request counted as aborted, not finished."""
import json
import time

import httpx
import pytest

from tests.e2e.http_helpers import completion_body
from tests.e2e.server_process import REQUEST_TIMEOUT_S, engine_idle, engine_load, read_metric, wait_until
from tests.helpers.tiny_model import make_wide_gguf

CONTEXT = 2048
MAX_TOKENS = 1900
# On the shared server's 2-layer model the engine made its 480 tokens (all its context holds) in well under a
# second: beside another suite the frontend, short of CPU, was still streaming the first ones when the request had
# already finished, and the test saw nothing running. Here a step takes milliseconds: the request runs for seconds.


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """Overrides conftest's model for this module's server."""
    return make_wide_gguf(tmp_path_factory.mktemp("model") / "wide.gguf", context=CONTEXT)


@pytest.fixture
def server(server_factory):
    return server_factory("--num-kv-blocks", str(CONTEXT // 16))


def test_client_disconnect_aborts_the_request(server):
    aborted_before = read_metric(server.url, "vllm:request_success_total", 'finished_reason="abort"')
    generated_before = read_metric(server.url, "vllm:generation_tokens_total")
    body = completion_body("The history of the world, part", max_tokens=MAX_TOKENS, ignore_eos=True,
                           temperature=0, stream=True)
    chunks = []
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        with client.stream("POST", server.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[len("data: "):]))
                    if len(chunks) == 2:
                        break
            # Before leaving: the request is in the batch and holds KV blocks.
            running, waiting, kv = engine_load(server.url)
            assert running == 1 and kv > 0, (running, waiting, kv)
        # leaving the `with` closes the response and its connection mid-stream
    t_closed = time.monotonic()
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks), chunks

    assert wait_until(lambda: engine_idle(server.url), 5), \
        f"the request still runs {time.monotonic() - t_closed:.1f} s after the client left: {engine_load(server.url)}"

    # It was aborted, not finished. How many tokens it got is the OS's call, not ours: a loaded machine that leaves
    # the frontend unscheduled for a while lets the engine go on until the disconnect is read (measured on the
    # 2-layer model: 2 when idle, 278 beside another test run; on this one 29 when idle).
    assert wait_until(lambda: read_metric(server.url, "vllm:request_success_total",
                                          'finished_reason="abort"') == aborted_before + 1, 5)
    generated = read_metric(server.url, "vllm:generation_tokens_total") - generated_before
    print(f"{generated} tokens generated before the abort")
    assert 2 <= generated < MAX_TOKENS, generated
