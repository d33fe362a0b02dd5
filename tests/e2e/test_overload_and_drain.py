"""Overload, deadlines and shutdown through the real server: past --max-waiting-requests the excess gets 503 with
Retry-After while every accepted request completes and the frontend's memory stays put; --request-timeout ends a
request with a 504 and frees its KV blocks; SIGTERM lets running streams finish while new requests are refused,
ends those that outlive --shutdown-timeout with an error, and exits 0 with no process left.

A stopped worker (SIGSTOP) is how these tests hold requests where they want them: nothing gets a first token while
it is stopped, and everything resumes with SIGCONT."""
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.e2e.http_helpers import completion_body, stream
from tests.e2e.server_process import REQUEST_TIMEOUT_S, alive_of, describe, engine_idle, read_metric, wait_until

FLOOD = 24
STREAMS = 8


def frontend_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def post_all(url: str, count: int, body: dict) -> list[httpx.Response]:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: httpx.post(url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S),
                             range(count)))


def test_a_flood_past_the_waiting_limit_gets_503s_and_every_accepted_request_completes(server_factory):
    server = server_factory("--max-waiting-requests", "3", "--max-num-seqs", "4")
    _, worker = server.engine_pids()
    body = completion_body("Hello there", max_tokens=6, ignore_eos=True, temperature=0)
    post_all(server.url, 3, body)  # the batch sizes are compiled before the measurement (3: none is refused)
    rss_before = frontend_rss_kib(server.pid)

    os.kill(worker, signal.SIGSTOP)  # no request gets its first token: the first three wait, the rest are refused
    try:
        with ThreadPoolExecutor(FLOOD) as pool:
            pending = [pool.submit(httpx.post, server.url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
                       for _ in range(FLOOD)]
            assert wait_until(lambda: sum(f.done() for f in pending) == FLOOD - 3, 60), \
                f"{sum(f.done() for f in pending)} answered" + server.log_tail()
            assert read_metric(server.url, "tinyvllm:num_requests_waiting_admission") == 3
            os.kill(worker, signal.SIGCONT)
            replies = [f.result() for f in pending]
    finally:
        os.kill(worker, signal.SIGCONT)
    busy = [r for r in replies if r.status_code == 503]
    served = [r for r in replies if r.status_code == 200]
    assert len(busy) == FLOOD - 3 and len(served) == 3, [r.status_code for r in replies]
    assert all(r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "ServiceUnavailableError" for r in busy)
    assert all(r.json()["usage"]["completion_tokens"] == 6 for r in served)
    assert read_metric(server.url, "tinyvllm:requests_rejected_total", 'reason="queue_full"') == FLOOD - 3

    for _ in range(5):  # five more floods: whatever a refused or served request leaves behind would add up
        assert {r.status_code for r in post_all(server.url, FLOOD, body)} <= {200, 503}
    growth_mib = (frontend_rss_kib(server.pid) - rss_before) / 1024
    assert growth_mib < 32, f"the frontend grew by {growth_mib:.0f} MiB over six floods"
    assert wait_until(lambda: engine_idle(server.url), 30)


def test_the_request_timeout_ends_a_request_with_a_504_and_frees_its_blocks(server_factory):
    server = server_factory("--request-timeout", "2")
    _, worker = server.engine_pids()

    def hello() -> httpx.Response:
        return httpx.post(server.url + "/v1/completions", json=completion_body("Hello", max_tokens=5),
                          timeout=REQUEST_TIMEOUT_S)

    # The first requests of a shape wait for tinygrad's compiles, and may time out while they do.
    assert wait_until(lambda: hello().status_code == 200, 300, interval_s=0), server.log_tail()
    os.kill(worker, signal.SIGSTOP)
    try:
        late = hello()
        streamed = stream(server.url, "/v1/completions", completion_body("Hello", max_tokens=5))
    finally:
        os.kill(worker, signal.SIGCONT)
    assert late.status_code == 504 and "--request-timeout" in late.json()["error"]["message"]
    assert streamed.status == 200 and streamed.errors[-1]["error"]["code"] == 504 and streamed.done
    assert wait_until(lambda: engine_idle(server.url), 30), "the timed-out requests kept their KV blocks"
    assert hello().status_code == 200


def test_sigterm_lets_running_streams_finish_refuses_new_requests_and_exits_0(server_factory):
    server = server_factory("--max-num-seqs", "8", "--shutdown-timeout", "300")  # first compiles of batch 8 too
    results, started = [None] * STREAMS, threading.Semaphore(0)
    _, worker = server.engine_pids()

    def run(i: int) -> None:
        results[i] = stream(server.url, "/v1/completions",
                            completion_body("Once upon a time", max_tokens=40, ignore_eos=True, temperature=0))

    os.kill(worker, signal.SIGSTOP)  # the streams start together, and are all open when SIGTERM arrives
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(STREAMS)]
    for t in threads:
        t.start()
    assert wait_until(lambda: read_metric(server.url, "tinyvllm:num_requests_waiting_admission") == STREAMS, 60)
    tree = server.snapshot()
    server.proc.send_signal(signal.SIGTERM)
    assert wait_until(lambda: httpx.get(server.url + "/health", timeout=10).status_code == 503, 30)
    refused = httpx.post(server.url + "/v1/completions", json=completion_body("Hi", max_tokens=2), timeout=30)
    assert refused.status_code == 503 and refused.headers["connection"] == "close"
    os.kill(worker, signal.SIGCONT)
    for t in threads:
        t.join(REQUEST_TIMEOUT_S)
    assert [(r.status, r.finish_reason, r.done, r.errors) for r in results] == [(200, "length", True, [])] * STREAMS
    assert server.wait_exit(60) is not None and server.proc.returncode == 0, server.log_tail()
    assert wait_until(lambda: not alive_of(tree), 10), describe(alive_of(tree))


def test_streams_that_outlive_the_shutdown_timeout_end_with_an_error_and_the_server_still_exits_0(server_factory):
    server = server_factory("--shutdown-timeout", "1")
    _, worker = server.engine_pids()
    results = [None] * 2

    def run(i: int) -> None:
        results[i] = stream(server.url, "/v1/completions", completion_body("Once", max_tokens=40, ignore_eos=True))

    os.kill(worker, signal.SIGSTOP)  # stays stopped: these streams cannot finish
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    assert wait_until(lambda: read_metric(server.url, "tinyvllm:num_requests_waiting_admission") == 2, 60)
    tree = server.snapshot()
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    for r in results:
        assert r.errors and r.errors[-1]["error"]["code"] == 503 and "shutting down" in r.errors[-1]["error"]["message"]
    assert server.wait_exit(60) is not None and server.proc.returncode == 0, server.log_tail()
    assert wait_until(lambda: not alive_of(tree), 10), describe(alive_of(tree))  # the stopped worker included
