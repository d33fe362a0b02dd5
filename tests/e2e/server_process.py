"""`tinyvllm serve` as a real process, and /proc helpers to see what it started.

Every server is `python -m tinyvllm.frontend.cli.main serve ...` started in its own session (so a Ctrl-C in the pytest
terminal does not reach it), with DEV=CPU and its stdout+stderr in a log file; it is up once it prints
`tinyvllm ready:`. Its processes are tracked two ways, so that an orphan re-parented to init is still
found: descendants by ppid (snapshots taken while the server runs) and every process of its session.
"""
from __future__ import annotations

import errno
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[2]
READY_LINE = "tinyvllm ready:"
STARTUP_TIMEOUT_S = float(os.environ.get("TINYVLLM_E2E_STARTUP_TIMEOUT", 240))
# A request may wait for tinygrad to compile a new batch/chunk bucket on a busy 2-core machine.
REQUEST_TIMEOUT_S = float(os.environ.get("TINYVLLM_E2E_REQUEST_TIMEOUT", 240))
MODEL_NAME = "tiny"  # --served-model-name of every test server
SERVE_DEFAULTS = ("--num-kv-blocks", "64", "--max-num-seqs", "16", "--served-model-name", MODEL_NAME, "--no-jit-warmup")
SIZED_BY_MEMORY = SERVE_DEFAULTS[2:]  # without --num-kv-blocks: for a test that gives --kv-cache-memory


# ---- /proc ----------------------------------------------------------------------------------------------------

def read_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, session id, start time) of a pid, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[3]), int(fields[19])


def _all_stats() -> dict[int, tuple[str, int, int, int]]:
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := read_stat(int(entry))) is not None and stat[0] != "Z":
            stats[int(entry)] = stat
    return stats


def descendants(root: int) -> dict[int, int]:
    """Every live process below `root` (children, grandchildren, ...), as {pid: start time}."""
    children: dict[int, list[int]] = {}
    stats = _all_stats()
    for pid, (_, ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            if pid not in found:
                found[pid] = stats[pid][3]
                todo.append(pid)
    return found


def session_members(sid: int) -> dict[int, int]:
    """Every live process of session `sid`, as {pid: start time}."""
    return {pid: st[3] for pid, st in _all_stats().items() if st[2] == sid}


def is_alive(pid: int, starttime: int | None = None) -> bool:
    """True while `pid` runs; a zombie counts as gone, and so does a recycled pid (another start time)."""
    stat = read_stat(pid)
    return stat is not None and stat[0] != "Z" and (starttime is None or stat[3] == starttime)


def alive_of(procs: dict[int, int]) -> list[int]:
    return sorted(pid for pid, start in procs.items() if is_alive(pid, start))


def children_of(pid: int) -> list[int]:
    return sorted(p for p, st in _all_stats().items() if st[1] == pid)


def cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def describe(pids) -> str:
    return "; ".join(f"{pid}: {cmdline(pid)[:150]}" for pid in pids)


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


PORT_TAKEN = f"[Errno {errno.EADDRINUSE}] error while attempting to bind on address ('127.0.0.1'"  # uvicorn's


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- /metrics -------------------------------------------------------------------------------------------------

def metrics_text(url: str) -> str:
    """One read of /metrics (a loaded frontend may take seconds for each: read once, look up many)."""
    return httpx.get(url + "/metrics", timeout=30).text


def read_metric(url: str, name: str, labels: str = "", text: str | None = None) -> float:
    """The value of one sample of /metrics (or of `text`, one read of it); `labels` is a substring its label set
    must contain."""
    text = metrics_text(url) if text is None else text
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE):
        if labels in (m.group(1) or ""):
            return float(m.group(2))
    if name.endswith("_total"):
        return 0.0  # a labelled counter appears only once it has counted something
    raise AssertionError(f"{name}{{{labels}}} is not in /metrics:\n{text[:3000]}")


def engine_load(url: str) -> tuple[float, float, float]:
    """(running, waiting, kv cache usage) as one read of /metrics reports them (three reads, seconds apart on a
    loaded machine, once saw a request running and no KV in use)."""
    text = metrics_text(url)
    return tuple(read_metric(url, name, text=text) for name in
                 ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"))


def engine_idle(url: str) -> bool:
    return engine_load(url) == (0.0, 0.0, 0.0)


# ---- the server ---------------------------------------------------------------------------------------------

class ServerProcess:
    def __init__(self, model: pathlib.Path | None, log_path: pathlib.Path, *extra_args: str, command_prefix: tuple = (),
                 defaults: tuple = SERVE_DEFAULTS):
        """command_prefix: what runs the server, e.g. ("ip", "netns", "exec", name) (it must exec, keeping the pid);
        defaults: the flags before extra_args."""
        self.log_path = log_path
        self.known: dict[int, int] = {}  # every descendant ever seen
        self._command = (command_prefix, model, defaults, extra_args)
        self._launch()

    def _launch(self) -> None:
        """Starts the server on a free port. (free_port's port is free when asked, not when the server binds it:
        another suite on the machine may take it in between; wait_ready then launches again on another.)"""
        command_prefix, model, defaults, extra_args = self._command
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        private_store = str(self.log_path.parent / f"models-{self.port}")  # never the user's ~/.cache model store
        model_flag = ("--model", str(model)) if model is not None else ()  # None: --models-dir's models on demand
        cmd = [*command_prefix, sys.executable, "-m", "tinyvllm.frontend.cli.main", "serve", *model_flag,
               "--port", str(self.port), *defaults, "--models-dir", private_store, *extra_args]
        env = {**os.environ, "DEV": "CPU", "PYTHONUNBUFFERED": "1"}
        self._log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 4000) -> str:
        return f"\n---- {self.log_path} (tail) ----\n{self.log()[-n:]}"

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S, relaunches: int = 3) -> None:
        deadline = time.monotonic() + timeout_s
        while READY_LINE not in self.log():
            if self.proc.poll() is not None and relaunches > 0 and PORT_TAKEN in self.log():
                self.kill_leftovers(grace_s=5)  # its engine, started before the HTTP port turned out taken
                self._log_file.close()
                self._launch()
                relaunches -= 1
                continue
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode} before it was ready"
                                     + self.log_tail())
            if time.monotonic() > deadline:
                raise AssertionError(f"the server was not ready after {timeout_s:.0f} s" + self.log_tail())
            time.sleep(0.1)
        self.snapshot()

    def snapshot(self) -> dict[int, int]:
        """The server's live descendants now (also remembered for the cleanup check)."""
        now = descendants(self.pid)
        self.known.update(now)
        return now

    def tracked(self) -> dict[int, int]:
        """Descendants seen so far plus every process of the server's session (orphans included)."""
        self.snapshot()
        return {**self.known, **{p: s for p, s in session_members(self.pid).items() if p != self.pid}}

    def engine_pids(self) -> tuple[int, int]:
        """(scheduler pid, worker pid). The scheduler logs the worker's pid when it joins; the scheduler is
        the server's child running `python -m tinyvllm.scheduler.main`."""
        m = re.search(r"worker rank 0 \(\S+, pid (\d+)\) at \S+ joined", self.log())
        assert m, "the worker's pid is not in the log" + self.log_tail()
        worker = int(m.group(1))
        children = children_of(self.pid)
        assert worker in children, (worker, describe(children))
        others = [pid for pid in children if pid != worker and "tinyvllm.scheduler.main" in cmdline(pid)]
        assert len(others) == 1, describe(children)
        return others[0], worker

    def signal_and_wait(self, sig: int, timeout_s: float) -> float | None:
        """Sends `sig` to the server alone; returns the seconds it took to exit, or None if it did not in time."""
        self.snapshot()
        self.proc.send_signal(sig)
        return self.wait_exit(timeout_s)

    def wait_exit(self, timeout_s: float) -> float | None:
        """Seconds until the server exited, or None if it still runs after timeout_s."""
        start = time.monotonic()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic() - start

    def kill_leftovers(self, grace_s: float = 0.0) -> list[int]:
        """Waits up to grace_s for the server's processes to end, then SIGKILLs those left; returns their pids."""
        procs = self.tracked()
        if self.proc.poll() is None:
            procs[self.pid] = read_stat(self.pid)[3] if read_stat(self.pid) else 0
        wait_until(lambda: not alive_of(procs), grace_s)
        left = alive_of(procs)
        description = describe(left)
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
        self.leftover_description = description
        return left

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> list[int]:
        """Signals the server (if it runs), waits, and kills what is left; returns the pids that had to be killed."""
        if self.proc.poll() is None:
            self.signal_and_wait(sig, timeout_s)
        return self.kill_leftovers(grace_s=5)


def start_server(model: pathlib.Path, log_path: pathlib.Path, *extra_args: str) -> ServerProcess:
    server = ServerProcess(model, log_path, *extra_args)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server
