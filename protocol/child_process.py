"""One engine process (the scheduler, a worker) run as its own program: `python -m <module> '<json args>'`.

Not multiprocessing's spawn: that re-runs the caller's `__main__` in every child, so a user's script without an
`if __name__ == "__main__":` guard (or one piped to `python -`) started the engine again inside each child and
failed. The children read nothing from standard input; the arguments are dataclasses, sent as JSON."""
import dataclasses
import json
import os
import subprocess
import sys
import types
import typing


class ChildProcess:
    def __init__(self, name: str, module: str, *args, env: dict[str, str] | None = None, new_session: bool = False):
        """env: variables set for the child on top of this process's environment; new_session: the child leads a
        session of its own (a terminal's Ctrl-C, sent to the foreground group, does not reach it)."""
        self.name, self.env, self.new_session = name, env or {}, new_session
        payload = [dataclasses.asdict(a) if dataclasses.is_dataclass(a) else a for a in args]
        self.command = [sys.executable, "-m", module, json.dumps(payload)]
        self._popen: subprocess.Popen | None = None

    def start(self) -> None:
        self._popen = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                       start_new_session=self.new_session)

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


def child_args(argv: list[str], *types) -> list:
    """In the child: the JSON arguments ChildProcess passed, each rebuilt as its type in `types` (a dataclass,
    nested ones included, or a plain JSON type)."""
    return [_build(tp, value) for tp, value in zip(types, json.loads(argv[1]), strict=True)]


def _build(tp, value):
    if value is not None and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{k: _build(hints[k], v) for k, v in value.items()})
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(inner[0], value) if len(inner) == 1 else value
    return value
