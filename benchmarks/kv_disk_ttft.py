"""Time to first token of the first request after a restart, with and without the prefix cache on disk
(`serve --kv-cache-dir`), for a long shared prompt (a system prompt), on this machine.

    .venv/bin/python benchmarks/kv_disk_ttft.py [--prompt-tokens 1000] [--repeats 3] [--no-jit-warmup] [--model M]

Per repeat: a server with --kv-cache-dir (a fresh temporary folder) serves the prompt once and stops (the files are
written); then, for each case, a server starts (its jitted steps captured at start, unless --no-jit-warmup), and the
first request it gets is the same prompt, streamed, max_tokens 1: TTFT is the time from sending it to its first token.
"with disk cache" restarts over the folder, "without" restarts without --kv-cache-dir. The prompt is token ids (exact
length), 1,000 by default; DEV=CPU unless DEV is set; other flags are serve's defaults.
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.e2e.server_process import READY_LINE, free_port  # noqa: E402

STARTUP_TIMEOUT_S, STOP_TIMEOUT_S = 900, 90


class Server:
    def __init__(self, log_path: pathlib.Path, *args: str):
        self.port, self.log_path = free_port(), log_path
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "tinyvllm.frontend.cli", "serve", "--port", str(self.port), *args]
        self.log_file = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env={"DEV": "CPU", **os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while READY_LINE not in log_path.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start: see {log_path}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log_file.close()


def first_token(url: str, prompt: list[int]) -> tuple[float, int]:
    """(seconds to the first streamed token, cached prompt tokens) of one streamed request."""
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start, ttft, cached = time.perf_counter(), None, -1
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600, trust_env=False) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            if ttft is None and '"text"' in line:
                ttft = time.perf_counter() - start
            if '"usage"' in line and '"prompt_tokens_details"' in line:
                usage = json.loads(line[6:]).get("usage") or {}
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", -1)
    return ttft, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-jit-warmup", action="store_true")
    parser.add_argument("--model", default=None)
    a = parser.parse_args()
    common = [*(["--model", a.model] if a.model else []),
              "--no-jit-warmup" if a.no_jit_warmup else "--warmup-before-serving"]
    prompt = [1000 + (i * 7919) % 40000 for i in range(a.prompt_tokens)]
    work = pathlib.Path(tempfile.mkdtemp(prefix="kv-disk-bench-"))
    results: dict[str, list[tuple[float, int]]] = {"without disk cache": [], "with disk cache": []}
    try:
        for repeat in range(a.repeats):
            cache_dir = work / f"kv{repeat}"
            server = Server(work / f"fill{repeat}.log", *common, "--kv-cache-dir", str(cache_dir))
            first_token(server.url, prompt)
            time.sleep(1)  # the files are written in the background; a stop waits for them anyway
            server.stop()
            for case, extra in (("with disk cache", ["--kv-cache-dir", str(cache_dir)]), ("without disk cache", [])):
                server = Server(work / f"{case.replace(' ', '-')}{repeat}.log", *common, *extra)
                try:
                    results[case].append(first_token(server.url, prompt))
                finally:
                    server.stop()
                print(f"repeat {repeat}: {case}: TTFT {results[case][-1][0] * 1e3:.0f} ms, "
                      f"cached_tokens {results[case][-1][1]}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"| first request after a restart ({a.prompt_tokens}-token prompt) | TTFT median (ms) | TTFT min-max (ms) "
          f"| cached_tokens |")
    print("|---|---|---|---|")
    for case, rows in results.items():
        ttfts = [t * 1e3 for t, _ in rows]
        print(f"| {case} | {statistics.median(ttfts):.0f} | {min(ttfts):.0f}-{max(ttfts):.0f} | {rows[0][1]} |")


if __name__ == "__main__":
    main()
