"""`tinyvllm run` with no server answering at a local host: `tinyvllm serve` as a child process for the chat.

The child runs in a session of its own, so a Ctrl-C that stops a reply does not reach it; it is stopped with
SIGTERM when the chat ends. Its output goes to a log file, kept (and named) only when it fails to start.
"""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlsplit

from tinyvllm.frontend.cli.client import CliError, OllamaApi
from tinyvllm.protocol.model_path import DEFAULT_MODEL_NAMES

STARTUP_TIMEOUT_ENV = "TINYVLLM_RUN_STARTUP_TIMEOUT"
STOP_TIMEOUT_S = 45.0  # serve's default --shutdown-timeout (30 s) and its teardown


def serve_model_argument(model: str | None) -> str | None:
    """What `serve --model` gets for `run MODEL`: a path or the default model's name; None (serve's default
    model, whose model store may know MODEL) for any other name."""
    if model is None:
        return None
    if model.lower() in DEFAULT_MODEL_NAMES or pathlib.Path(model).expanduser().exists():
        return model
    return None


def serve_command(base_url: str, model: str | None) -> list[str]:
    parts = urlsplit(base_url)
    command = [sys.executable, "-m", "tinyvllm.frontend.cli.main", "serve", "--host", parts.hostname or "127.0.0.1",
               "--port", str(parts.port)]
    return command + (["--model", model] if model else [])


class LocalServer:
    def __init__(self, command: list[str]):
        self.log = tempfile.NamedTemporaryFile(prefix="tinyvllm-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.keep_log = False

    def last_log_line(self) -> str:
        lines = pathlib.Path(self.log.name).read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(no output)"

    def wait_ready(self, api: OllamaApi, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not api.answers():
            if self.proc.poll() is not None:
                self.keep_log = True  # the error names it
                raise CliError(f"`tinyvllm serve` exited with {self.proc.returncode} before it was ready: "
                               f"{self.last_log_line()} (log: {self.log.name})")
            if time.monotonic() > deadline:
                self.keep_log = True
                raise CliError(f"`tinyvllm serve` was not ready after {timeout_s:.0f} s (log: {self.log.name})")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session and group: the engine processes too
                self.proc.wait()
        self.log.close()
        if not self.keep_log:
            os.unlink(self.log.name)


def start_local_server(api: OllamaApi, model: str | None, err=sys.stderr) -> LocalServer:
    """Starts `tinyvllm serve` at api's host and waits until it answers; CliError if it does not."""
    server = LocalServer(serve_command(api.base_url, model))
    err.write(f"No server answered at {api.base_url}: starting `tinyvllm serve` there (log: {server.log.name}; "
              "it stops when you leave the chat)...\n")
    err.flush()
    try:
        server.wait_ready(api, float(os.environ.get(STARTUP_TIMEOUT_ENV, 900)))
    except BaseException:
        server.stop()
        raise
    return server
