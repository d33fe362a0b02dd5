"""`tinyvllm worker` as a real process (python -m tinyvllm.frontend.cli.main worker ...), its output in a log file."""
from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys

from tests.e2e.server_process import REPO, wait_until


class WorkerProcess:
    def __init__(self, log_path: pathlib.Path, connect: str, rank: int, *extra_args: str, secret: str | None = None,
                 command_prefix: tuple = ()):
        """secret goes in $TINYVLLM_WORKER_SECRET (None: unset). command_prefix as ServerProcess's."""
        self.log_path = log_path
        cmd = [*command_prefix, sys.executable, "-m", "tinyvllm.frontend.cli.main", "worker", "--connect", connect,
               "--rank", str(rank), "--no-jit-warmup", *extra_args]
        env = {k: v for k, v in os.environ.items() if k != "TINYVLLM_WORKER_SECRET"}
        env.update({"DEV": "CPU", "PYTHONUNBUFFERED": "1", **({"TINYVLLM_WORKER_SECRET": secret} if secret else {})})
        with open(log_path, "wb") as log_file:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 3000) -> str:
        return f"\n---- {self.log_path} (tail) ----\n{self.log()[-n:]}"

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or None if it still runs after timeout_s."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def wait_for_log(self, pattern: str, timeout_s: float) -> re.Match:
        assert wait_until(lambda: re.search(pattern, self.log()) is not None, timeout_s), \
            f"{pattern!r} is not in the worker's log" + self.log_tail()
        return re.search(pattern, self.log())

    def kill(self) -> None:
        """SIGKILL, unless it has exited (cleanup after a failed test)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
