"""One engine process (the scheduler, a worker) run as its own program: `python -m <module> '<json args>'`.

Not multiprocessing's spawn: that re-runs the caller's `__main__` in every child, so a user's script without an
`if __name__ == "__main__":` guard (or one piped to `python -`) started the engine again inside each child and
failed. The children read nothing from standard input; the arguments are dataclasses, sent as JSON."""
import dataclasses
import json
import os
import subprocess
import sys


class ChildProcess:
    def __init__(self, name: str, module: str, *args, env: dict[str, str] | None = None):
        """env: variables set for the child on top of this process's environment."""
        self.name, self.env = name, env or {}
        payload = [dataclasses.asdict(a) if dataclasses.is_dataclass(a) else a for a in args]
        self.command = [sys.executable, "-m", module, json.dumps(payload)]
        self._popen: subprocess.Popen | None = None

    def start(self) -> None:
        self._popen = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, env={**os.environ, **self.env})

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    @property
    def exitcode(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def join(self, timeout_s: float | None = None) -> None:
        if self._popen is not None:
            try:
                self._popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass

    def terminate(self) -> None:
        if self.is_alive():
            self._popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()


def child_args(argv: list[str]) -> list:
    """In the child: the JSON arguments ChildProcess passed (dataclasses as dicts)."""
    return json.loads(argv[1])
