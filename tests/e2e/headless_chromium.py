"""Debian's chromium, headless, driven over the Chrome DevTools Protocol (a websocket): open a page, evaluate
JavaScript in it, capture a screenshot. `make install` installs chromium when it is missing."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time

import httpx
from websockets.sync.client import connect

START_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 30.0


class HeadlessChromium:
    def __init__(self, profile_dir: pathlib.Path, width: int = 1280, height: int = 1100):
        binary = shutil.which("chromium")
        assert binary, "chromium is not installed: `make install` (or apt-get install chromium) installs it"
        profile_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = profile_dir / "chromium.log"
        args = [binary, "--headless=new", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-dev-shm-usage", f"--window-size={width},{height}",
                f"--user-data-dir={profile_dir}", "--remote-debugging-port=0", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # chromium refuses to run as root with its sandbox
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._next_id = 0
        self._connection = contextlib.ExitStack()
        try:
            self.ws = self._connection.enter_context(connect(
                self._page_websocket_url(profile_dir / "DevToolsActivePort"), max_size=None,
                open_timeout=START_TIMEOUT_S))
        except BaseException:
            self.close()
            raise

    def _page_websocket_url(self, port_file: pathlib.Path) -> str:
        """chromium writes the port it chose into its profile; the page target's websocket is listed at /json."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().strip()):
            assert self.proc.poll() is None, f"chromium exited: {self.log_path.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        while True:
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            assert time.monotonic() < deadline, f"chromium shows no page: {targets}"
            time.sleep(0.1)

    def send(self, method: str, **params) -> dict:
        """One CDP command's result (events that arrive meanwhile are dropped)."""
        self._next_id += 1
        command_id = self._next_id
        self.ws.send(json.dumps({"id": command_id, "method": method, "params": params}))
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.0, deadline - time.monotonic())))
            if message.get("id") == command_id:
                assert "error" not in message, f"{method}: {message['error']}"
                return message["result"]

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.evaluate("document.readyState") != "complete" or self.evaluate("location.href") == "about:blank":
            assert time.monotonic() < deadline, f"{url} did not load"
            time.sleep(0.1)

    def screenshot(self, path: pathlib.Path) -> pathlib.Path:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))
        return path

    def close(self) -> None:
        self._connection.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):  # its renderer and helpers, if any outlived it
            os.killpg(self.proc.pid, signal.SIGKILL)

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
