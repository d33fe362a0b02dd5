"""A lone worker serves at once and captures its jitted steps while idle (workers/background_warmup.py): the server
is ready before the captures finish, answers meanwhile, and answers the same once every bucket is captured. The
captured steps are written to the disk (workers/captured_steps.py): a restart loads every one of them instead of
capturing, and answers the same. Without the warm-up (--no-jit-warmup, as `LLM(...)` runs) the steps served requests
captured are written all the same, and a restart loads them."""
import re

from tests.e2e.http_helpers import complete, completion_body
from tests.e2e.server_process import READY_LINE, SERVE_DEFAULTS, ServerProcess, wait_until
from tinyvllm.workers.captured_steps import ROOT_ENV

DONE = "background warm-up done"


def test_serves_before_and_after_the_background_captures(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "captured-steps"))  # none stored yet
    defaults = tuple(a for a in SERVE_DEFAULTS if a != "--no-jit-warmup")
    server = ServerProcess(tiny_model, tmp_path / "server.log", "--max-num-batched-tokens", "4", "--max-num-seqs",
                           "2", defaults=defaults)
    try:
        server.wait_ready()
        body = completion_body("The sky is", max_tokens=6, temperature=0)
        first, _ = complete(server.url, "/v1/completions", body)
        assert wait_until(lambda: DONE in server.log(), 180), server.log_tail()
        again, _ = complete(server.url, "/v1/completions", body)
        assert again == first
        log = server.log()
        assert log.index(READY_LINE) < log.index(DONE)
        captured = re.findall(r"prepared the (\d+)-token step", log)
        assert captured == sorted(captured, key=int) and set(captured) <= {"1", "2", "4"}, captured
        assert "0 of 3 captured steps from the disk cache" in log
    finally:
        assert not server.stop(), server.leftover_description
    restarted = ServerProcess(tiny_model, tmp_path / "restart.log", "--max-num-batched-tokens", "4", "--max-num-seqs",
                              "2", defaults=defaults)
    try:
        restarted.wait_ready()
        assert "3 of 3 captured steps from the disk cache" in restarted.log(), restarted.log_tail()
        assert complete(restarted.url, "/v1/completions", body)[0] == first
        assert wait_until(lambda: DONE in restarted.log(), 180), restarted.log_tail()
        assert complete(restarted.url, "/v1/completions", body)[0] == first
    finally:
        assert not restarted.stop(), restarted.leftover_description


def test_without_the_warm_up_the_steps_requests_captured_are_stored_and_loaded(tiny_model, tmp_path, monkeypatch):
    steps_dir = tmp_path / "captured-steps"
    monkeypatch.setenv(ROOT_ENV, str(steps_dir))
    small = ("--max-num-batched-tokens", "4", "--max-num-seqs", "2")
    body = completion_body("The sky is", max_tokens=6, temperature=0)  # a 4-token chunk, then 1-token decode steps
    server = ServerProcess(tiny_model, tmp_path / "server.log", *small)
    try:
        server.wait_ready()
        first, _ = complete(server.url, "/v1/completions", body)
        stored = lambda: {p.name for p in steps_dir.rglob("forward-*.pkl")}
        assert wait_until(lambda: stored() >= {"forward-1.pkl", "forward-4.pkl"}, 60), (stored(), server.log_tail())
        assert DONE not in server.log() and "prepared the" not in server.log()  # no warm-up ran
    finally:
        assert not server.stop(), server.leftover_description
    restarted = ServerProcess(tiny_model, tmp_path / "restart.log", *small)
    try:
        restarted.wait_ready()
        assert "2 of 3 captured steps from the disk cache" in restarted.log(), restarted.log_tail()
        assert complete(restarted.url, "/v1/completions", body)[0] == first
    finally:
        assert not restarted.stop(), restarted.leftover_description
