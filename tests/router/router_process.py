"""`tinyvllm router` as a real process (its own session, its output in a log file), ready once it prints its ready
line; and a steady request load through it, from threads, that records every failure."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx

from tests.e2e.http_helpers import completion_body
from tests.e2e.server_process import REPO, REQUEST_TIMEOUT_S, free_port, read_metric, wait_until

READY_LINE = "tinyvllm router ready:"


class RouterProcess:
    def __init__(self, log_path, *extra_args: str, host: str = "127.0.0.1", command_prefix: tuple = ()):
        """command_prefix: what runs the router, e.g. ("ip", "netns", "exec", name) (it must exec, keeping the pid)."""
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.log_path = log_path
        self._log_file = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [*command_prefix, sys.executable, "-m", "tinyvllm.frontend.cli.main", "router", "--host", host,
             "--port", str(self.port), *extra_args],
            cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=self._log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 60) -> None:
        ok = wait_until(lambda: READY_LINE in self.log() or self.proc.poll() is not None, timeout_s)
        assert ok and self.proc.poll() is None, f"the router did not start:\n{self.log()[-3000:]}"

    def instances(self) -> dict[str, dict]:
        rows = httpx.get(self.url + "/instances", timeout=30, trust_env=False).json()["instances"]
        return {row["url"]: row for row in rows}

    def routed_to(self, instance_url: str) -> float:
        return sum(read_metric(self.url, "tinyvllm_router:routing_decisions_total",
                               f'instance="{instance_url}",reason="{reason}"')
                   for reason in ("cache", "load", "prefill-cache", "prefill-load"))

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log_file.close()
        return self.proc.returncode


class SteadyLoad:
    """`threads` clients sending short completions through `url` one after another until stop(); every answer that
    is not a 200 with a whole completion is kept in `failures`."""

    def __init__(self, url: str, threads: int = 3, max_tokens: int = 4):
        self.url, self.max_tokens = url, max_tokens
        self.done, self.failures = 0, []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self, i: int) -> None:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
            n = 0
            while not self._stop.is_set():
                body = completion_body(f"Client {i} asks question {n}:", max_tokens=self.max_tokens, temperature=0)
                n += 1
                try:
                    r = client.post(self.url + "/v1/completions", json=body)
                    ok = r.status_code == 200 and r.json()["choices"][0]["finish_reason"] is not None
                    failure = None if ok else f"{r.status_code} {r.text[:300]}"
                except httpx.HTTPError as e:
                    failure = repr(e)
                with self._lock:
                    self.done += 1
                    if failure is not None:
                        self.failures.append(failure)

    def wait_for(self, more: int, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        """Waits until `more` further requests have completed."""
        target = self.done + more
        assert wait_until(lambda: self.done >= target, timeout_s), f"the load stalled at {self.done}"

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(REQUEST_TIMEOUT_S)


def since(start: float) -> float:
    return time.monotonic() - start


LONG_STREAM_TOKENS = 1800  # seconds of decoding on the wide twins, even on a fast machine (their context: 2,048)


def kill_mid_stream(router: RouterProcess, candidates: list, tries: int = 3) -> tuple[object, float, list[str]]:
    """Streams a LONG_STREAM_TOKENS completion through the router and SIGKILLs the one of `candidates` (server
    processes) the router shows it open on, once its first token has come: (that victim, when it was killed, the
    stream's remaining non-empty lines). A stream that ended before the test looked (a test process stalled on a
    loaded machine) is started again, up to `tries` times."""
    body = completion_body("A long story:", max_tokens=LONG_STREAM_TOKENS, ignore_eos=True, temperature=0, stream=True)
    for _ in range(tries):
        with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S,
                          trust_env=False) as response:
            assert response.status_code == 200, response.read()
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))  # the stream is under way
            serving = [c for c in candidates if router.instances().get(c.url, {}).get("open_requests")]
            assert len(serving) <= 1, router.instances()
            if serving:
                serving[0].snapshot()
                os.kill(serving[0].pid, signal.SIGKILL)
                killed_at = time.monotonic()
            rest = [line for line in lines if line]
        if serving:
            return serving[0], killed_at, rest
    raise AssertionError(f"{tries} streams ended before the test found their instance: {router.instances()}")
