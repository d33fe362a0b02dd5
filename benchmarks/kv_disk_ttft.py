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
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.e2e.server_process import ServerProcess  # noqa: E402
from tinyvllm.protocol.model_path import resolve_model_path  # noqa: E402

STARTUP_TIMEOUT_S = 900


def start_bench_server(log_path: pathlib.Path, *args: str, model: str | None = None) -> ServerProcess:
    """`tinyvllm serve` with serve's defaults and `args` (the tests' ServerProcess, none of the tests' flags)."""
    server = ServerProcess(resolve_model_path(model), log_path, *args, defaults=())
    try:
        server.wait_ready(STARTUP_TIMEOUT_S)
    except BaseException:
        server.stop()
        raise
    return server


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
    common = ["--no-jit-warmup" if a.no_jit_warmup else "--warmup-before-serving"]
    prompt = [1000 + (i * 7919) % 40000 for i in range(a.prompt_tokens)]
    work = pathlib.Path(tempfile.mkdtemp(prefix="kv-disk-bench-"))
    results: dict[str, list[tuple[float, int]]] = {"without disk cache": [], "with disk cache": []}
    try:
        for repeat in range(a.repeats):
            cache_dir = work / f"kv{repeat}"
            server = start_bench_server(work / f"fill{repeat}.log", *common, "--kv-cache-dir", str(cache_dir),
                                        model=a.model)
            first_token(server.url, prompt)
            time.sleep(1)  # the files are written in the background; a stop waits for them anyway
            server.stop()
            for case, extra in (("with disk cache", ["--kv-cache-dir", str(cache_dir)]), ("without disk cache", [])):
                server = start_bench_server(work / f"{case.replace(' ', '-')}{repeat}.log", *common, *extra,
                                            model=a.model)
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
