"""Does disaggregated prefill/decode protect decode streams' inter-token latency (ITL) while long prompts keep
arriving, and at what cost in throughput, on this (2-core) machine?

    .venv/bin/python benchmarks/pd_itl.py [--duration 120] [--streams 4] [--stream-tokens 128] [--prompt-interval 4]
        [--prompt-tokens 2000] [--only split|mixed] [--port-base N]
    .venv/bin/python benchmarks/pd_itl.py --duration 20 --streams 2 --prompt-interval 6   # a short check

split: `tinyvllm router` + `serve --role prefill` (taskset -c 0) + `serve --role decode` (taskset -c 1), registered
with the router, which clients use (it sends each request to the prefill instance with max_tokens=1, then to the decode
instance, which pulls the prompt's KV); mixed: one `serve` (role both, chunked prefill; taskset -c 0,1). DEV=CPU, the
default model and flags; the router and this load generator unpinned. After an unmeasured warm-up, for --duration s:
--streams clients looping over streamed /v1/completions (~20-token prompt, ignore_eos, max_tokens --stream-tokens;
ITL = gaps between a response's token chunks), and every --prompt-interval s a non-streamed one of a unique ~--prompt-
tokens prompt (a random number first; sized through POST /tokenize), max_tokens 16. Only the window's events count.
"""
import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.e2e.server_process import READY_LINE, free_port, wait_until  # noqa: E402

ROUTER_READY_LINE, STARTUP_TIMEOUT_S, STOP_TIMEOUT_S, LONG_MAX_TOKENS = "tinyvllm router ready:", 600, 40, 16
WORDS = "the a sea sky blue why how river stone light old new tell me about write short story of green city".split()
CLI = [sys.executable, "-m", "tinyvllm.frontend.cli.main"]
ITL_P50, ITL_P99, DECODE_TPS, TOTAL_TPS = "ITL p50 (ms)", "ITL p99 (ms)", "decode tokens/s", "total generated tokens/s"


class Processes:
    """The processes of one configuration, each in its own session (process group), NAME's output in NAME.log."""

    def __init__(self, folder: pathlib.Path):
        self.folder, self.started = folder, []  # [(name, Popen, ready line)]

    def start(self, name: str, cmd: list[str], ready_line: str) -> None:
        print(f"  {name}: {shlex.join(cmd)}", flush=True)
        with open(self.folder / f"{name}.log", "wb") as log:
            self.started.append((name, subprocess.Popen(
                cmd, cwd=REPO, env={**os.environ, "DEV": "CPU", "PYTHONUNBUFFERED": "1"}, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True), ready_line))

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def wait_ready(self) -> None:
        for name, proc, line in self.started:
            wait_until(lambda: line in self.log(name) or proc.poll() is not None, STARTUP_TIMEOUT_S, 0.5)
            if line not in self.log(name) or proc.poll() is not None:
                raise RuntimeError(f"{name} not ready (exit {proc.poll()}); its log ends:\n{self.log(name)[-3000:]}")

    def stop(self) -> None:
        """SIGTERM to each leader, then (once it exited, STOP_TIMEOUT_S at most) SIGKILL to the rest of its group."""
        for _, proc, _ in self.started:
            proc.terminate()  # a server drains, then stops its engine processes itself
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for _, proc, _ in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start(name: str, procs: Processes, ports: list[int]) -> tuple[str, str]:
    """Starts configuration `name`: (the URL clients use, a server's URL for /tokenize)."""
    def serve(cores: str, port: int, *extra: str) -> list[str]:
        return ["taskset", "-c", cores, *CLI, "serve", "--port", str(port), "--warmup-before-serving", "--models-dir",
                str(procs.folder / f"models-{port}"), *extra]
    if name == "mixed":
        procs.start("mixed", serve("0,1", ports[3]), READY_LINE)
        procs.wait_ready()
        return (url := f"http://127.0.0.1:{ports[3]}"), url
    router = f"http://127.0.0.1:{ports[0]}"
    procs.start("router", [*CLI, "router", "--port", str(ports[0])], ROUTER_READY_LINE)
    for role, core, port in (("prefill", "0", ports[1]), ("decode", "1", ports[2])):
        procs.start(role, serve(core, port, "--role", role, "--register-with", router), READY_LINE)
    procs.wait_ready()
    listing = lambda: httpx.get(router + "/instances", trust_env=False).json()["instances"]  # noqa: E731
    if not wait_until(lambda: [row["state"] for row in listing()].count("routable") == 2, 60, 0.5):
        raise RuntimeError(f"the router does not route to both instances: {listing()}")
    return router, f"http://127.0.0.1:{ports[1]}"


class Load:
    """The clients; what they saw: token arrivals, (end, ITL), (sent, TTFT), long prompts' (end, latency, ...)."""

    def __init__(self, args, url: str, model: str):
        self.args, self.url, self.model, self.long_words, self.rng = args, url, model, 0, random.Random(0)
        self.token_times, self.gaps, self.ttfts, self.long_done, self.errors, self.long_sent = [], [], [], [], [], 0

    def body(self, words: int, max_tokens: int, stream: bool) -> dict:
        prompt = f"{self.rng.randrange(10**9)}: " + " ".join(self.rng.choices(WORDS, k=words))  # unique from the start
        return {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, "temperature": 0,
                "ignore_eos": True}

    async def size_long_prompts(self, client: httpx.AsyncClient, tokenize_url: str) -> int:
        """Sets long_words for ~--prompt-tokens tokens through /tokenize; returns the tokens of such a prompt."""
        async def count(words: int) -> int:  # /tokenize reads the prompt of a completion's body
            return (await client.post(tokenize_url + "/tokenize", json=self.body(words, 1, False))).json()["count"]
        self.long_words = round(self.args.prompt_tokens ** 2 / await count(self.args.prompt_tokens))
        return await count(self.long_words)

    async def stream(self, client: httpx.AsyncClient, max_tokens: int) -> None:
        """One streamed completion of a short prompt, recorded chunk by chunk (up to the window's end if cut there)."""
        sent, last = time.monotonic(), None  # the first token's wait is TTFT, the others' ITL
        async with client.stream("POST", self.url + "/v1/completions", json=self.body(16, max_tokens, True)) as r:
            if r.status_code != 200:
                raise RuntimeError(f"stream: {r.status_code} {(await r.aread())[:300]!r}")
            async for line in r.aiter_lines():
                chunk = json.loads(line[6:]) if line.startswith("data: {") else {}
                if "error" in chunk:
                    raise RuntimeError(f"stream: error event {line[:300]}")
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    self.token_times.append(now := time.monotonic())
                    (self.ttfts.append((sent, now - sent)) if last is None else self.gaps.append((now, now - last)))
                    last = now

    async def long(self, client: httpx.AsyncClient) -> None:
        sent = time.monotonic()
        r = await client.post(self.url + "/v1/completions", json=self.body(self.long_words, LONG_MAX_TOKENS, False))
        if r.status_code != 200:
            raise RuntimeError(f"long prompt: {r.status_code} {r.text[:300]}")
        usage = r.json()["usage"]
        self.long_done.append((time.monotonic(), time.monotonic() - sent, usage["completion_tokens"],
                               (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)))

    async def logging_errors(self, request) -> None:
        try:
            await request
        except (httpx.HTTPError, RuntimeError) as e:
            self.errors.append(f"{type(e).__name__}: {e}")
            await asyncio.sleep(1)

    async def stream_loop(self, client: httpx.AsyncClient) -> None:
        while True:
            await self.logging_errors(self.stream(client, self.args.stream_tokens))

    async def long_loop(self, client: httpx.AsyncClient, tasks: set) -> None:
        while True:
            self.long_sent += 1
            tasks.add(task := asyncio.create_task(self.logging_errors(self.long(client))))
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(self.args.prompt_interval)


async def measure(args, url: str, tokenize_url: str) -> tuple[dict, list[str]]:
    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=None), trust_env=False) as client:
        load = Load(args, url, (await client.get(url + "/v1/models")).json()["data"][0]["id"])
        long_tokens = await load.size_long_prompts(client, tokenize_url)
        for _ in range(2):  # warm-up, not measured
            await asyncio.gather(load.long(client), *(load.stream(client, 16) for _ in range(args.streams)))
        start, long_tasks = time.monotonic(), set()
        tasks = [asyncio.create_task(loop) for loop in [load.long_loop(client, long_tasks),
                                                         *(load.stream_loop(client) for _ in range(args.streams))]]
        await asyncio.sleep(args.duration)
        end = time.monotonic()
        for task in [*tasks, *long_tasks]:
            task.cancel()
        await asyncio.gather(*tasks, *long_tasks, return_exceptions=True)
    return summarize(load, start, end, long_tokens), load.errors


def summarize(load: Load, start: float, end: float, long_tokens: int) -> dict:
    """The table's rows: label -> value."""
    def percentile(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")
    gaps = [gap * 1000 for at, gap in load.gaps if start <= at - gap and at <= end]
    ttfts = [ttft for sent, ttft in load.ttfts if start <= sent and sent + ttft <= end]
    stream_tokens = sum(start <= t <= end for t in load.token_times)
    long_done = [row[1:] for row in load.long_done if start <= row[0] <= end]
    return {ITL_P50: percentile(gaps, 50), "ITL p90 (ms)": percentile(gaps, 90), ITL_P99: percentile(gaps, 99),
            "ITL gaps measured": len(gaps), "stream TTFT median (s)": percentile(ttfts, 50), DECODE_TPS:
            stream_tokens / (end - start), "long prompt tokens": long_tokens,
            "long prompts sent / completed": f"{load.long_sent} / {len(long_done)}",
            "long prompt median latency (s)": percentile([latency for latency, _, _ in long_done], 50),
            "long prompt cached tokens (median)": percentile([cached for _, _, cached in long_done], 50),
            TOTAL_TPS: (stream_tokens + sum(tokens for _, tokens, _ in long_done)) / (end - start),
            "client errors": len(load.errors)}


def print_table(results: dict) -> None:
    print("\n| | " + " | ".join(results) + " |\n|---|" + "---:|" * len(results))
    for label in next(iter(results.values()), {}):
        cells = (f"{r[label]:.2f}" if isinstance(r[label], float) else str(r[label]) for r in results.values())
        print(f"| {label} | " + " | ".join(cells) + " |")
    if len(results) == 2:
        split, mixed = results["split"], results["mixed"]
        print("\nsplit/mixed: " + ", ".join(f"{label} {split[label] / mixed[label]:.2f}x" for label in
                                           (ITL_P50, ITL_P99, DECODE_TPS, TOTAL_TPS) if mixed[label]))


def run_configuration(name: str, args, folder: pathlib.Path, ports: list[int], began: float) -> dict | None:
    """Its results (None if it failed); prints its client errors and its logs' errors; stops its processes always."""
    procs, results, load_errors = Processes(folder), None, []
    try:
        url, tokenize_url = start(name, procs, ports)
        print(f"{name}: ready at {time.monotonic() - began:.0f} s; warm-up, then the measured load", flush=True)
        results, load_errors = asyncio.run(measure(args, url, tokenize_url))
    except Exception as e:  # the other configuration still runs
        print(f"{name} FAILED: {type(e).__name__}: {e}", flush=True)
    finally:
        problems = [f"{proc}: {line[:300]}" for proc, _, _ in procs.started for line in procs.log(proc)
                    .splitlines() if "ERROR" in line or "Traceback" in line][:12]
        procs.stop()
    print("".join(f"{name} client error ({len(load_errors)} in all): {e}\n" for e in load_errors[:5]) +
          "".join(f"{name} log {line}\n" for line in problems), end="", flush=True)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=120, help="seconds of measured load per configuration")
    ap.add_argument("--streams", type=int, default=4, help="concurrent decode streams")
    ap.add_argument("--stream-tokens", type=int, default=128, help="max_tokens of each stream")
    ap.add_argument("--prompt-interval", type=float, default=4, help="seconds between two long prompts")
    ap.add_argument("--prompt-tokens", type=int, default=2000, help="tokens of each long prompt")
    ap.add_argument("--only", choices=("split", "mixed"), default=None)
    ap.add_argument("--port-base", type=int, default=0, help="router, prefill, decode, mixed: N..N+3 (0: free ports)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stops the processes as Ctrl-C does
    began, folder = time.monotonic(), pathlib.Path(tempfile.mkdtemp(prefix="tinyvllm-pd-itl-"))
    ports = [args.port_base + i for i in range(4)] if args.port_base else [free_port() for _ in range(4)]
    cpu = next((s.split(":", 1)[1].strip() for s in open("/proc/cpuinfo") if s.startswith("model name")), "?")
    print(f"command: {shlex.join([sys.executable, *sys.argv])}\nnproc: {len(os.sched_getaffinity(0))}, CPU: {cpu}\n"
          f"router and load generator: unpinned; logs: {folder}", flush=True)
    runs = {name: run_configuration(name, args, folder, ports, began) for name in ("split", "mixed")
            if args.only in (None, name)}
    results = {name: result for name, result in runs.items() if result is not None}
    print_table(results)
    print(f"\nlogs: {folder}; wall time {time.monotonic() - began:.0f} s")
    return 0 if len(results) == len(runs) and not any(r["client errors"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
