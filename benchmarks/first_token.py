"""Start-up to first token: `tinyvllm serve` from launch to its first chat answer (max_tokens 1), cold (empty tinygrad
kernel cache and ~/.cache/tinyvllm: a fresh machine) and warm (the caches the cold start filled, kept serving until its
background warm-up was done: a restart of a server that ran a while), with
the jitted steps captured in the background (the default) and before serving (--warmup-before-serving).

    .venv/bin/python benchmarks/first_token.py [--repeats 1] [--no-warmup-wait] [-- extra serve flags]

(--no-warmup-wait: restart right after the cold start's first token, for models whose warm-up takes many minutes.)

Prints a markdown table: seconds to ready (/health answers) and to the first token, per mode and cache state.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.e2e.server_process import free_port  # noqa: E402

MODES = {"background warm-up (default)": [], "--warmup-before-serving": ["--warmup-before-serving"]}


def first_token(extra: list[str], cache_dir: str, wait_for_warmup: bool = False) -> tuple[float, float]:
    """(seconds to ready, to the first token); wait_for_warmup: then keep serving until the background warm-up is
    done (a server that ran a while: what a restart finds in the caches)."""
    port = free_port()
    env = {**os.environ, "DEV": os.environ.get("DEV", "CPU"), "XDG_CACHE_HOME": cache_dir,
           "CACHEDB": os.path.join(cache_dir, "tinygrad.db")}
    log_path = os.path.join(cache_dir, "serve.log")
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tinyvllm.frontend.cli.main", "serve", "--port", str(port), *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(log_path, "w"), start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        ready = time.monotonic() - start
        r = httpx.post(url + "/v1/chat/completions", timeout=600,
                       json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
        r.raise_for_status()
        first = time.monotonic() - start
        deadline = time.monotonic() + 600
        while wait_for_warmup and "warm-up done" not in open(log_path).read() and time.monotonic() < deadline:
            time.sleep(1)
        return ready, first
    finally:
        proc.terminate()
        proc.wait(120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--no-warmup-wait", action="store_true", help="restart without waiting for the warm-up")
    parser.add_argument("serve_args", nargs="*", help="after --: more `tinyvllm serve` flags")
    a = parser.parse_args()
    print("| mode | caches | ready (s) | first token (s) |\n|---|---|---|---|")
    for mode in a.modes:
        flags = MODES[mode]
        cold, warm = [], []
        for _ in range(a.repeats):
            with tempfile.TemporaryDirectory(prefix="first-token-") as cache_dir:
                cold.append(first_token(flags + a.serve_args, cache_dir,
                                        "--warmup-before-serving" not in flags and not a.no_warmup_wait))
                warm.append(first_token(flags + a.serve_args, cache_dir))
        for state, runs in (("cold", cold), ("warm (restart)", warm)):
            print(f"| {mode} | {state} | {statistics.median(r[0] for r in runs):.1f} | "
                  f"{statistics.median(r[1] for r in runs):.1f} |", flush=True)


if __name__ == "__main__":
    main()
