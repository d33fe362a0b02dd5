"""Runs deploy/container-entrypoint.sh with a fake `tinyvllm` (and `getent`) first on PATH, and returns what the fake
was exec'd with: its argv, its environment and its pid (the entrypoint's own pid when it exec'd)."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "deploy" / "container-entrypoint.sh"
FAKE = """#!{python}
import json, os, sys
with open(os.environ["FAKE_OUT"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "pid": os.getpid()}}, f)
"""
# getent hosts NAME: fails while FAKE_GETENT_FAILURES (a count in a file) is above zero, counting the calls
FAKE_GETENT = """#!/usr/bin/env bash
calls=$(( $(cat "$FAKE_GETENT_CALLS" 2>/dev/null || echo 0) + 1 )); echo "$calls" > "$FAKE_GETENT_CALLS"
[ "$calls" -gt "${FAKE_GETENT_FAILURES:-0}" ] && echo "10.0.0.1 $2"
"""


class Run:
    def __init__(self, returncode: int, stderr: str, popen_pid: int, exec_record: dict | None, getent_calls: int):
        self.returncode, self.stderr, self.popen_pid, self.getent_calls = returncode, stderr, popen_pid, getent_calls
        self.argv = exec_record["argv"] if exec_record else None
        self.env = exec_record["env"] if exec_record else None
        self.pid = exec_record["pid"] if exec_record else None


def run_entrypoint(tmp_path: Path, args: list[str], env: dict[str, str], getent_failures: int = 0) -> Run:
    """The entrypoint with args and only env (plus PATH to the fakes), as a container would start it."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("tinyvllm", FAKE.format(python=sys.executable)), ("getent", FAKE_GETENT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out, calls = tmp_path / "exec.json", tmp_path / "getent-calls"
    for stale in (out, calls):
        stale.unlink(missing_ok=True)
    full_env = {**env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_OUT": str(out),
                "FAKE_GETENT_CALLS": str(calls), "FAKE_GETENT_FAILURES": str(getent_failures)}
    proc = subprocess.Popen([str(ENTRYPOINT), *args], env=full_env, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=30)
    record = json.loads(out.read_text()) if out.exists() else None
    return Run(proc.returncode, stderr, proc.pid, record, int(calls.read_text()) if calls.exists() else 0)
