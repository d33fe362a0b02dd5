"""A client that goes away mid-stream (a real socket closed by httpx) aborts its request: the engine stops
running it and frees its KV blocks within seconds, long before it could have finished on its own."""
import json
import time

import httpx

from tests.e2e.http_helpers import completion_body
from tests.e2e.server_process import REQUEST_TIMEOUT_S, engine_idle, engine_load, read_metric, wait_until

MAX_TOKENS = 480  # the prompt is a few tokens; max_model_len is 512


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

    # It was aborted, not finished: far fewer than MAX_TOKENS tokens were generated in all.
    assert wait_until(lambda: read_metric(server.url, "vllm:request_success_total",
                                          'finished_reason="abort"') == aborted_before + 1, 5)
    generated = read_metric(server.url, "vllm:generation_tokens_total") - generated_before
    assert 2 <= generated < MAX_TOKENS / 2, generated
