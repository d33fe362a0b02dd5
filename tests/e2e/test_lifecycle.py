"""Process lifecycle: SIGTERM, SIGINT and a terminal's Ctrl-C stop the server and everything it started within
seconds; after SIGKILL to the server, its children notice and exit on their own."""
import os
import signal

import pytest

from tests.e2e.http_helpers import complete, completion_body
from tests.e2e.server_process import alive_of, describe, session_members, wait_until

EXIT_DEADLINE_S = 15
# An orderly stop (frontend -> Shutdown -> scheduler -> workers) takes about a second even on a busy machine;
# EngineProcesses.stop() only falls back to terminate() after waiting 5 s for each child that was not told.
# (That fallback is what a SIGTERM got while frontend/api/server.py's handler raised KeyboardInterrupt inside the event
# loop: the loop died before EngineClient.close() could send Shutdown, and every stop took ~10 s.)
GRACEFUL_S = 8


def start_busy_server(server_factory):
    """A server that has served a request, so the worker has also started tinygrad's compiler processes."""
    server = server_factory()
    complete(server.url, "/v1/completions", completion_body("Hello", max_tokens=2, temperature=0))
    tree = server.snapshot()  # children and grandchildren, from /proc, before any signal
    scheduler, worker = server.engine_pids()
    assert {scheduler, worker} <= set(tree), describe(tree)
    return server, tree


def assert_all_gone(server, tree, timeout_s: float) -> None:
    assert wait_until(lambda: not alive_of(tree), timeout_s), \
        f"still running {timeout_s} s after the server exited: {describe(alive_of(tree))}"
    orphans = [pid for pid in session_members(server.pid) if pid != server.pid]
    assert not orphans, f"processes of the server's session are still running: {describe(orphans)}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_server_and_all_its_processes(server_factory, sig):
    """systemd/docker stop with SIGTERM, a shell's `kill -INT` with SIGINT: both must stop in order, quickly."""
    server, tree = start_busy_server(server_factory)
    exit_s = server.signal_and_wait(sig, EXIT_DEADLINE_S)
    assert exit_s is not None, f"the server still runs {EXIT_DEADLINE_S} s after {sig.name}" + server.log_tail()
    assert server.proc.returncode == 0, f"exit code {server.proc.returncode}" + server.log_tail()
    assert_all_gone(server, tree, 2)  # the server waits for its children before it exits
    assert exit_s < GRACEFUL_S, f"{sig.name}: the server took {exit_s:.1f} s to stop" + server.log_tail()


def test_ctrl_c_in_a_terminal_stops_everything(server_factory):
    """A terminal sends SIGINT to the whole foreground process group: the server and its children at once."""
    server, tree = start_busy_server(server_factory)
    os.killpg(server.pid, signal.SIGINT)
    exit_s = server.wait_exit(EXIT_DEADLINE_S)
    assert exit_s is not None, f"the server still runs {EXIT_DEADLINE_S} s after Ctrl-C" + server.log_tail()
    assert server.proc.returncode == 0, f"exit code {server.proc.returncode}" + server.log_tail()
    assert_all_gone(server, tree, 2)
    assert exit_s < GRACEFUL_S, f"the server took {exit_s:.1f} s to stop after Ctrl-C" + server.log_tail()


def test_children_exit_when_the_server_is_killed(server_factory):
    server, tree = start_busy_server(server_factory)
    exit_s = server.signal_and_wait(signal.SIGKILL, 10)
    assert exit_s is not None and server.proc.returncode == -signal.SIGKILL
    assert_all_gone(server, tree, 5)  # nobody tells them: they watch their parent
