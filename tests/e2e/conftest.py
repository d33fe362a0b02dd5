"""End-to-end fixtures: a tiny random model with the real tokenizer, and `tinyvllm serve` as a real process.

Every server is `python -m frontend.cli serve ...` in its own session (process group), with DEV=CPU, its
stdout+stderr in a log file under the test's tmp dir, and is considered up once it prints `tinyvllm ready:`.
Teardown sends SIGTERM, waits, and then makes sure that neither the server nor anything it started
(found by walking /proc for descendants) is left running, killing leftovers and failing loudly if needed.
"""
from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.helpers.tiny_model import make_tiny_gguf

REPO = pathlib.Path(__file__).resolve().parents[2]
READY_LINE = "tinyvllm ready:"
STARTUP_TIMEOUT_S = float(os.environ.get("TINYVLLM_E2E_STARTUP_TIMEOUT", 240))
# One request may have to wait for tinygrad to compile a new batch/chunk bucket on a busy 2-core machine.
REQUEST_TIMEOUT_S = float(os.environ.get("TINYVLLM_E2E_REQUEST_TIMEOUT", 240))
MODEL_NAME = "tiny"  # --served-model-name of every test server
SERVE_DEFAULTS = ("--num-kv-blocks", "64", "--max-num-seqs", "16", "--served-model-name", MODEL_NAME)


# ---- /proc helpers ---------------------------------------------------------------------------------------

def _read_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) of a live pid, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = data[data.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every live process below `root` (children, grandchildren, ...), as {pid: starttime}."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _read_stat(int(entry))) is not None and stat[0] != "Z":
            children.setdefault(stat[1], []).append((int(entry), stat[2]))
    found, todo = {}, [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            if pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def is_alive(pid: int, starttime: int | None = None) -> bool:
    """True while `pid` runs (a zombie counts as gone; a recycled pid with another start time too)."""
    stat = _read_stat(pid)
    return stat is not None and stat[0] != "Z" and (starttime is None or stat[2] == starttime)


def alive_of(procs: dict[int, int]) -> list[int]:
    return [pid for pid, start in procs.items() if is_alive(pid, start)]


def cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- metrics ------------------------------------------------------------------------------------------------

def read_metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    assert m, f"{name} is not in /metrics:\n{text[:2000]}"
    return float(m.group(1))


def engine_idle(url: str) -> bool:
    return (read_metric(url, "vllm:num_requests_running") == 0 and read_metric(url, "vllm:num_requests_waiting") == 0
            and read_metric(url, "vllm:kv_cache_usage_perc") == 0)


# ---- the server process ---------------------------------------------------------------------------------

class ServerProcess:
    def __init__(self, model: pathlib.Path, log_path: pathlib.Path, *extra_args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "frontend.cli", "serve", "--model", str(model), "--port", str(self.port),
               *SERVE_DEFAULTS, *extra_args]
        env = {**os.environ, "DEV": "CPU", "PYTHONUNBUFFERED": "1"}
        self._log_file = open(log_path, "wb")
        # Its own session: a Ctrl-C in the pytest terminal does not reach it, and teardown can kill the group.
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        self.known: dict[int, int] = {}  # every descendant ever seen, for the final cleanup check

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while READY_LINE not in self.log():
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode} before it was ready:\n"
                                     f"{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the server was not ready after {timeout_s:.0f} s:\n{self.log()[-4000:]}")
            time.sleep(0.1)
        self.snapshot()

    def snapshot(self) -> dict[int, int]:
        """The server's live descendants now; remembered for the teardown check."""
        now = descendants(self.pid)
        self.known.update(now)
        return now

    def engine_pids(self) -> tuple[int, int]:
        """(scheduler pid, worker pid): the worker announces its pid in the scheduler's log; the scheduler is the
        server's other spawned child (the third one is multiprocessing's resource tracker)."""
        m = re.search(r"worker rank 0 \(\S+, pid (\d+)\) said hello", self.log())
        assert m, "the worker's pid is not in the log"
        worker = int(m.group(1))
        children = [pid for pid in self.snapshot() if _read_stat(pid) and _read_stat(pid)[1] == self.pid]
        assert worker in children, (worker, children)
        spawned = [pid for pid in children if pid != worker and "spawn_main" in cmdline(pid)]
        assert len(spawned) == 1, {pid: cmdline(pid) for pid in children}
        return spawned[0], worker

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int | None:
        """Signals the server and waits; kills whatever of its process tree is left. Returns its exit code."""
        self.snapshot()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill_leftovers()
        return self.proc.returncode

    def kill_leftovers(self) -> list[int]:
        """SIGKILLs the server and every descendant ever seen that still runs; returns those pids."""
        self.known.update(descendants(self.pid))
        left = alive_of(self.known)
        if self.proc.poll() is None:
            left.append(self.pid)
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._log_file.close()
        return left


def start_server(model: pathlib.Path, log_path: pathlib.Path, *extra_args: str) -> ServerProcess:
    server = ServerProcess(model, log_path, *extra_args)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


# ---- fixtures -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> pathlib.Path:
    return make_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture
def server_factory(tiny_model, tmp_path):
    """Starts private servers (for tests that kill or signal them); cleans up whatever they leave."""
    servers: list[ServerProcess] = []

    def start(*extra_args: str) -> ServerProcess:
        server = start_server(tiny_model, tmp_path / f"server{len(servers)}.log", *extra_args)
        servers.append(server)
        return server

    yield start
    leftovers = {s.log_path.name: s.kill_leftovers() for s in servers}
    assert not any(leftovers.values()), f"processes left running after the test (killed now): {leftovers}"


@pytest.fixture(scope="session")
def shared_server(tiny_model, tmp_path_factory):
    """One server for every test that does not kill it."""
    server = start_server(tiny_model, tmp_path_factory.mktemp("shared") / "server.log")
    yield server
    code = server.stop()
    left = server.kill_leftovers()
    assert not left, f"the shared server left processes running: {left}"
    assert code is not None, "the shared server did not exit on SIGTERM"


@pytest.fixture
def server(shared_server) -> ServerProcess:
    """The shared server, checked to be alive and idle before each test."""
    assert shared_server.proc.poll() is None, f"the shared server died:\n{shared_server.log()[-4000:]}"
    assert wait_until(lambda: engine_idle(shared_server.url), 30), "the shared server is busy before the test"
    return shared_server
