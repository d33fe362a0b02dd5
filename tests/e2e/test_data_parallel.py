"""Two data-parallel replicas behind one server (--data-parallel-size 2): requests reach both, a shared prefix stays
on the replica that caches it, and a replica whose worker dies (SIGKILL) or hangs (SIGSTOP, caught by --step-timeout)
fails only its own requests, with an explicit error within seconds, while the other replica serves on; the broken
one is restarted and serves again within a minute. The first two tests share one server (the killed worker's test
leaves both replicas serving, as the restart must); the hang test has its own, with a short --step-timeout that
first-time captures under load must not meet."""
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.http_helpers import complete, completion_body
from tests.e2e.replicas import LongStreams, current_workers, engine_metric, per_engine, serving_lines
from tests.e2e.server_process import REQUEST_TIMEOUT_S, is_alive, start_server, wait_until
from tests.helpers.tiny_model import make_wide_gguf

CONTEXT = 4096
LONG_TOKENS = 3900  # a long request: tens of seconds even where a step takes milliseconds (1,900 ended before
# four had started on an AVX-512 EPYC)
DP = ("--data-parallel-size", "2", "--num-kv-blocks", str(2 * CONTEXT // 16))  # two long requests per replica
ENGINES = ("0", "1")
ERROR_DEADLINE_S = 5  # from the failure being detectable to every request on that replica having its error
RECOVERY_DEADLINE_S = 60
# Above the first steps of a fresh worker (each compiles its kernels: ~8 s on a 2-core machine).
STEP_TIMEOUT_S = 20


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """Overrides conftest's model for this module's servers: wide and deep, so that a long request is still running
    when the test breaks its replica. (The engine must not outrun the frontend by much: a loaded machine's frontend,
    short of CPU, streamed 450 tokens of a 2-layer model long after the engine had finished them, and answered
    /metrics in seconds.)"""
    return make_wide_gguf(tmp_path_factory.mktemp("model") / "wide.gguf", context=CONTEXT)


@pytest.fixture(scope="module")
def dp_server(tiny_model, tmp_path_factory):
    server = start_server(tiny_model, tmp_path_factory.mktemp("dp") / "server.log", *DP)
    yield server
    assert not server.stop(), f"the server left processes running: {server.leftover_description}"


@pytest.fixture
def server(dp_server):
    """The module's server, alive, with nothing running or waiting on either replica."""
    assert dp_server.proc.poll() is None, "the server died" + dp_server.log_tail()
    busy = lambda: {name: per_engine(dp_server, name, ENGINES)
                    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting")}
    assert wait_until(lambda: all(v == 0 for counts in busy().values() for v in counts.values()), 60), busy()
    return dp_server


def queries(server) -> dict[str, float]:
    return per_engine(server, "vllm:prefix_cache_queries_total", ENGINES)


def test_requests_reach_both_replicas_and_a_shared_prefix_stays_on_one(server):
    before = queries(server)
    for i in range(4):  # one after another: idle replicas take turns
        complete(server.url, "/v1/completions", completion_body(f"Question {i}:", max_tokens=2))
    assert all(queries(server)[e] > before[e] for e in ENGINES), (before, queries(server))

    prefix = "A long shared system prompt that every request of this workload starts with. " * 4  # > 3 blocks
    before, hits_before = queries(server), {e: engine_metric(server, "vllm:prefix_cache_hits_total", e)
                                            for e in ENGINES}
    complete(server.url, "/v1/completions", completion_body(prefix + "First:", max_tokens=2))
    with ThreadPoolExecutor(5) as pool:
        list(pool.map(lambda i: complete(server.url, "/v1/completions",
                                         completion_body(prefix + f"Question {i}:", max_tokens=2)), range(5)))
    grew = {e: queries(server)[e] - before[e] for e in ENGINES}
    (cached_on,) = [e for e in ENGINES if grew[e] > 0]  # all six on one replica
    hits = engine_metric(server, "vllm:prefix_cache_hits_total", cached_on) - hits_before[cached_on]
    assert hits >= 5 * 3 * 16, (grew, hits)  # the five later ones found at least three blocks each


def warm_up(server) -> None:
    """Both replicas run the shapes the test will (so its steps are not first-time jit captures)."""
    streams = LongStreams(server.url, 4, max_tokens=30)
    assert streams.join(REQUEST_TIMEOUT_S)
    assert all(r.finish_reason == "length" and not r.errors for r in streams.results), streams.results


def break_one_replica_under_load(server, sig: int, detect_s: float) -> None:
    """Two long streams on each replica; `sig` to engine 1's worker. Only engine 1's streams end, with an error
    naming it, within detect_s + ERROR_DEADLINE_S; engine 0's stream on; /health stays 200; engine 1 is restarted
    (its stopped worker killed) and serves again within RECOVERY_DEADLINE_S."""
    warm_up(server)
    running = lambda: per_engine(server, "vllm:num_requests_running", ENGINES)
    # Each stream is routed once the one before streams: with the replicas' reports current, the least loaded takes
    # it (a report still showing the last stream as waiting weighs it as four, and on a loaded machine split them 3-1).
    # Beside another test file's heavy engine the reports can still be late and the four split 3-1 (seen at 17731b3
    # too): those streams are ended and four placed again, a few times at most.
    for attempt in range(3):
        streams = LongStreams(server.url, 4, max_tokens=LONG_TOKENS, one_at_a_time=True,
                              describe=lambda: (running(), per_engine(server, "vllm:num_requests_waiting", ENGINES),
                                                server.log_tail()))
        if wait_until(lambda: running() == {"0": 2, "1": 2}, 120):
            break
        outcome = (running(), [(r.finish_reason, r.errors) if r else None for r in streams.results], server.log_tail())
        assert attempt < 2, outcome
        assert streams.hang_up(60) and wait_until(lambda: running() == {"0": 0, "1": 0}, 60), outcome
    (worker,) = current_workers(server, "engine 1")
    starts = len(serving_lines(server, "engine 1"))
    os.kill(worker, sig)
    broken_at = time.monotonic()
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # engine 0 still serves

    # Engine 1 is back while engine 0's long streams still run (the recovery deadline does not wait for them).
    assert wait_until(lambda: len(serving_lines(server, "engine 1")) == starts + 1, RECOVERY_DEADLINE_S), \
        server.log_tail()
    assert not is_alive(worker)
    # The new engine 1 is the least loaded, so the next requests reach it (its counters start from zero).
    while queries(server)["1"] == 0:
        assert time.monotonic() - broken_at < RECOVERY_DEADLINE_S, server.log_tail()
        complete(server.url, "/v1/completions", completion_body("Are you back?", max_tokens=2))
    assert time.monotonic() - broken_at < RECOVERY_DEADLINE_S

    # Engine 0's streams go on past the restart, with no error; then their client goes away (they need not run to
    # the end: they are long only so that they outlast a loaded machine's start of four), and both replicas empty.
    assert wait_until(lambda: sum(bool(r.errors) for r in streams.live) == 2, ERROR_DEADLINE_S + detect_s), \
        [r.events[-2:] for r in streams.live]
    serving_on = [r for r in streams.live if not r.errors]
    seen = [len(r.events) for r in serving_on]
    assert wait_until(lambda: all(r.finish_reason or len(r.events) >= n + 10 for r, n in zip(serving_on, seen)), 60), \
        ([len(r.events) for r in serving_on], seen, server.log_tail())
    assert streams.hang_up(REQUEST_TIMEOUT_S), server.log_tail()
    assert wait_until(lambda: running() == {"0": 0, "1": 0}, 60), (running(), server.log_tail())
    failed = [(r, at) for r, at in zip(streams.results, streams.ended_at) if r.errors]
    assert len(failed) == 2 and all(not r.errors and (r.hung_up or (r.done and r.finish_reason == "length"))
                                    for r in serving_on), \
        [r.events[-3:] for r in streams.results]
    for result, ended_at in failed:
        assert result.done and "engine 1" in result.errors[0]["error"]["message"], result.errors
        assert ended_at - broken_at < detect_s + ERROR_DEADLINE_S, ended_at - broken_at


def test_a_killed_worker_fails_only_its_replicas_requests_and_both_serve_again(server):
    break_one_replica_under_load(server, signal.SIGKILL, detect_s=0)


def test_a_stopped_worker_is_caught_by_the_step_timeout_and_its_replica_restarted(server_factory):
    server = server_factory(*DP, "--step-timeout", str(STEP_TIMEOUT_S))
    break_one_replica_under_load(server, signal.SIGSTOP, detect_s=STEP_TIMEOUT_S)
