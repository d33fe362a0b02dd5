"""An engine process dying (SIGKILL to the worker, or to the scheduler) while requests run: the clients get an
explicit error instead of hanging; while the server restarts the engine by itself, /health is 503 and new requests
are refused at once; then it serves again, and it still shuts down cleanly on SIGTERM without leaving processes
(the restarted engine's included) behind."""
import json
import os
import pathlib
import shutil
import signal
import threading
import time

import httpx
import pytest

from tests.e2e.http_helpers import assert_openai_error, chat_body, complete, completion_body, stream
from tests.e2e.server_process import REQUEST_TIMEOUT_S, alive_of, describe, engine_load, start_server, wait_until

LONG = {"max_tokens": 400, "ignore_eos": True, "temperature": 0}  # runs for many seconds unless stopped
ERROR_DEADLINE_S = 30  # the frontend polls its children every 0.5 s; this is generous for a loaded machine
RECOVERY_DEADLINE_S = 60
GIVE_UP_S = 1 + 2 + 4 + 8 + 16  # RestartPolicy's backoff before each of its 5 attempts


@pytest.mark.parametrize("victim", ["worker", "scheduler"])
def test_engine_process_death_fails_requests_fast(server_factory, victim):
    server = server_factory()
    scheduler_pid, worker_pid = server.engine_pids()
    pid = worker_pid if victim == "worker" else scheduler_pid

    streamed_events, tokens_flowing = [], threading.Event()
    results = {}

    def streamed():
        with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=REQUEST_TIMEOUT_S,
                          json=chat_body("Tell me a long story.", stream=True, **LONG)) as r:
            results["stream_status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data = line[len("data: "):]
                    streamed_events.append(data if data == "[DONE]" else json.loads(data))
                    if sum(1 for e in streamed_events if isinstance(e, dict) and e.get("choices")
                           and e["choices"][0]["delta"].get("content")) >= 2:
                        tokens_flowing.set()

    def plain():
        results["plain"] = httpx.post(server.url + "/v1/completions", timeout=REQUEST_TIMEOUT_S,
                                      json=completion_body("Once upon a time", **LONG))

    threads = [threading.Thread(target=streamed, daemon=True), threading.Thread(target=plain, daemon=True)]
    for t in threads:
        t.start()
    assert tokens_flowing.wait(REQUEST_TIMEOUT_S), f"no tokens streamed: {streamed_events}" + server.log_tail()
    assert wait_until(lambda: engine_load(server.url)[0] == 2, 30), f"{engine_load(server.url)}" + server.log_tail()
    assert "plain" not in results  # both requests are mid-generation

    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    for t in threads:
        t.join(ERROR_DEADLINE_S)
    assert not any(t.is_alive() for t in threads), \
        f"a client still waits {ERROR_DEADLINE_S} s after the {victim} died" + server.log_tail()
    elapsed = time.monotonic() - killed_at

    # The stream ends with an error event (then [DONE]), not with a normal finish.
    assert results["stream_status"] == 200
    errors = [e for e in streamed_events if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and streamed_events[-1] == "[DONE]", streamed_events[-3:]
    assert errors[0]["error"]["code"] in (500, 503) and errors[0]["error"]["message"], errors
    assert not any(isinstance(e, dict) and e.get("choices") and e["choices"][0].get("finish_reason")
                   for e in streamed_events), "the stream claims a normal finish"
    # The non-streamed request gets a 5xx with an OpenAI error body.
    plain = results["plain"]
    assert 500 <= plain.status_code < 600, (plain.status_code, plain.text)
    assert_openai_error(plain, plain.status_code)

    # The server knows it is broken and says so at once, to everyone, until the restarted engine is ready (at least
    # the 1 s backoff and a start after the failed group was stopped).
    assert httpx.get(server.url + "/health", timeout=10).status_code == 503
    t0 = time.monotonic()
    assert_openai_error(httpx.post(server.url + "/v1/completions", timeout=10,
                                   json=completion_body("hi", max_tokens=2)), 503)
    res = stream(server.url, "/v1/chat/completions", chat_body("hi", max_tokens=2), timeout=10)
    assert res.status == 503 and res.events[0]["error"]["code"] == 503, res.events
    assert time.monotonic() - t0 < 5
    assert elapsed < ERROR_DEADLINE_S

    assert wait_until(lambda: httpx.get(server.url + "/health", timeout=10).status_code == 200,
                      RECOVERY_DEADLINE_S), server.log_tail()
    assert "restart 1 of at most 5" in server.log()
    complete(server.url, "/v1/completions", completion_body("Hello again", max_tokens=2))

    # SIGTERM still stops everything, the restarted engine included.
    tracked = server.tracked()
    exit_s = server.signal_and_wait(signal.SIGTERM, 30)
    assert exit_s is not None, "the server did not exit within 30 s of SIGTERM" + server.log_tail()
    assert wait_until(lambda: not alive_of(tracked), 10), f"left running: {describe(alive_of(tracked))}"


def test_an_engine_that_cannot_be_restarted_makes_the_server_exit_non_zero(tiny_model, tmp_path):
    """So that systemd or Kubernetes restarts the server: here every restart fails, the model file being gone."""
    model = pathlib.Path(shutil.copy(tiny_model, tmp_path / "doomed.gguf"))
    server = start_server(model, tmp_path / "server.log")
    try:
        tracked = server.tracked()
        _, worker = server.engine_pids()
        model.unlink()
        os.kill(worker, signal.SIGKILL)
        assert wait_until(lambda: httpx.get(server.url + "/health", timeout=10).status_code == 503, 10)
        exit_s = server.wait_exit(GIVE_UP_S + 30)
        assert exit_s is not None, "the server still runs" + server.log_tail()
        assert server.proc.returncode == 1, server.log_tail()
        assert "engine gave up after 5 restarts" in server.log() and "not found" in server.log(), server.log_tail()
        assert wait_until(lambda: not alive_of(tracked), 10), f"left running: {describe(alive_of(tracked))}"
    finally:
        assert not server.stop(), server.leftover_description
