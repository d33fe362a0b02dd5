"""Chaos benchmark (issue 14): a real `tinyvllm serve` under mixed load, engine kills and schema-generated requests.

    .venv/bin/python benchmarks/chaos.py [--duration 1200] [--concurrency 32] [--kill-every 120]
        [--schemathesis-requests 10000] [--server-args "--max-num-seqs 32 ..."] [--port N]

Starts the server (DEV=CPU, the default model, DEFAULT_SERVER_ARGS or --server-args, a private Ollama model store,
its log in a temporary folder) and, for --duration seconds, all at once:
- --concurrency clients looping over /v1/completions, /v1/chat/completions, /api/generate and /api/chat, streamed
  and not, short random prompts, 4-32 new tokens; 30% of the requests are left (the connection closed) at random;
- every --kill-every seconds, SIGKILL to a random engine process (the scheduler or a worker below the server, never
  the frontend), but only once the restarted engine has served STABLE_AFTER_S (the server gives up after 5 groups in
  a row that die sooner), and none in the last quarter of the run, so that the engine that reports the KV blocks at
  the end has served load;
- --schemathesis-requests requests generated from the server's own /openapi.json (positive and negative cases of
  every operation, generation sizes capped: tests/helpers/openapi_fuzz.py), evenly paced over the run.
Then it waits for the server to go idle and prints a markdown table. Each request counts once, as
  completed          the whole answer came ([DONE], `"done": true`, or a whole 2xx body);
  errored explicitly a 4xx, a 503 without Retry-After (no engine serves), an error inside a 2xx stream, or a 5xx
                     for a request in flight within KILL_NOTICE_S of a kill (the server fails those with 500 or 503);
  rejected busy      a 503 with Retry-After (every other request counts as accepted);
  rejected invalid   a generated request answered 4xx (the schema cannot say everything the server checks);
  left on purpose    the client closed the connection before the answer ended;
  cut off silently   the connection ended with neither the whole answer nor an error (must be 0);
  hung               no answer within --request-deadline seconds (must be 0);
  unexpected 5xx     any other 5xx but 503 and 504 (--request-timeout), or such a code in a stream's error (must
                     be 0; the first few listed).
Exits 1 if a must-be-0 number is not 0, or the server died.
KV blocks in use at end (vllm:kv_cache_usage_perc x the pool's size; cached prefix blocks nobody holds count as free)
and vllm:num_requests_running/_waiting must be 0 too. Frontend RSS: VmRSS of the server once ready and at the end.
"""
import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import pathlib
import queue
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import schemathesis

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.e2e.server_process import (READY_LINE, STARTUP_TIMEOUT_S, cmdline, descendants, free_port,  # noqa: E402
                                      wait_until)
from tests.helpers.openapi_fuzz import capped, generate_until, naming_the_served_model  # noqa: E402
from tinyvllm.frontend.engine.engine_replica import RestartPolicy  # noqa: E402

DEFAULT_SERVER_ARGS = "--max-num-seqs 32 --max-waiting-requests 64 --request-timeout 120"
ENGINE_MODULES = ("tinyvllm.scheduler.main", "tinyvllm.workers.main")
LOAD_ROUTES = ("/v1/completions", "/v1/chat/completions", "/api/generate", "/api/chat")
WORDS = "the a sea sky blue why how river stone light old new tell me about write short story of".split()
LEAVING_SHARE, LEAVE_WITHIN_S = 0.3, 5.0
KILL_NOTICE_S = 5.0  # the frontend notices a dead engine process within 0.5 s; generous on a busy machine
STABLE_AFTER_S = RestartPolicy().stable_after_s + 5  # engines that die sooner count towards the server giving up
SERVING_LINE = re.compile(r"serving \(scheduler pid")  # logged each time an engine group starts serving


@dataclasses.dataclass
class Outcome:
    status: int | None = None  # None: no response head came
    retry_after: bool = False
    body_error: int | str | None = None  # the error in the body: OpenAI's code or Ollama's message
    answered: bool = False
    hung: bool = False
    left_on_purpose: bool = False
    generated: bool = False  # by schemathesis
    during_kill: bool = False  # in flight within KILL_NOTICE_S after an engine process was killed
    body: str = ""


def classify(o: Outcome) -> str:
    if o.left_on_purpose or o.hung or o.status is None:
        return "left on purpose" if o.left_on_purpose else "hung" if o.hung else "cut off silently"
    if o.status == 503 and o.retry_after:
        return "rejected busy"
    server_error = o.status >= 500 or isinstance(o.body_error, int) and o.body_error >= 500
    if server_error and not {503, 504} & {o.status, o.body_error} and not o.during_kill:  # 504: --request-timeout
        return "unexpected 5xx"
    if 400 <= o.status < 500 and o.generated:
        return "rejected invalid"
    if o.status >= 400 or o.body_error is not None or server_error:
        return "errored explicitly"
    return "completed" if o.answered else "cut off silently"


def read_answer(text: str, content_type: str) -> tuple[bool, int | str | None]:
    """(whether the whole answer is in `text`, the error it carries: OpenAI's code, Ollama's message, or None)."""
    sse, ndjson = "text/event-stream" in content_type, "ndjson" in content_type
    if not sse and "json" not in content_type:
        return True, None
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")] if sse else \
        [line for line in text.splitlines() if line.strip()] if ndjson else [text]
    try:
        objects = [json.loads(line) for line in lines if line != "[DONE]"]
    except ValueError:
        return False, None
    for error in (obj["error"] for obj in objects if isinstance(obj, dict) and "error" in obj):
        return False, error.get("code", 500) if isinstance(error, dict) else str(error)
    if ndjson:  # Ollama's generation ends with done: true; /api/pull and /api/create with status: success
        return bool(objects) and (objects[-1].get("done") is True or objects[-1].get("status") == "success"), None
    return "[DONE]" in lines or not sse, None


async def send(client: httpx.AsyncClient, method: str, url: str, deadline_s: float, leave_after_s: float | None,
               **request) -> Outcome:
    o, timeout_s = Outcome(), deadline_s if leave_after_s is None else min(deadline_s, leave_after_s)
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream(method, url, **request) as response:
                o.status, o.retry_after = response.status_code, "retry-after" in response.headers
                o.body = "".join([part async for part in response.aiter_text()])
    except TimeoutError:
        o.left_on_purpose, o.hung = timeout_s < deadline_s, timeout_s >= deadline_s
    except httpx.HTTPError as e:
        o.status, o.body = None, f"{type(e).__name__}: {e}"
    else:
        o.answered, o.body_error = read_answer(o.body, response.headers.get("content-type", ""))
    return o


class Chaos:
    def __init__(self, args, url: str, model: str, server: subprocess.Popen):
        self.args, self.url, self.model, self.server = args, url, model, server
        self.counts, self.errors = collections.Counter(), collections.Counter()  # outcomes; explicit errors by kind
        self.examples: dict[str, list[str]] = collections.defaultdict(list)  # the first few of each bad kind
        self.kills: list[tuple[float, str]] = []  # (when, "scheduler" or "worker")
        self.started, self.generated_sent = time.monotonic(), 0
        self.stop_at, self.rng = self.started + args.duration, random.Random(args.seed)

    def running(self) -> bool:
        return time.monotonic() < self.stop_at and self.server.poll() is None

    def record(self, o: Outcome, request: str, sent_at: float) -> None:
        o.during_kill = any(sent_at <= killed + KILL_NOTICE_S for killed, _ in self.kills)  # all killed before now
        self.counts[kind := classify(o)] += 1
        if kind in ("unexpected 5xx", "cut off silently", "hung") and len(self.examples[kind]) < 5:
            self.examples[kind].append(f"at {sent_at - self.started:.1f} s: {request} -> {o.status}: {o.body[:300]!r}")
        if kind == "errored explicitly":
            message = re.search(r'"(?:message|error)":\s*"([^"]{0,60})', o.body)
            self.errors[f"{o.status}, {message[1] if message else repr(o.body[:60])}"] += 1

    async def load_client(self, client: httpx.AsyncClient) -> None:
        while self.running():
            route, prompt = self.rng.choice(LOAD_ROUTES), " ".join(self.rng.choices(WORDS, k=self.rng.randint(2, 12)))
            body, new_tokens = {"model": self.model, "stream": self.rng.random() < 0.5}, self.rng.randint(4, 32)
            body |= {"messages": [{"role": "user", "content": prompt}]} if "chat" in route else {"prompt": prompt}
            body |= {"options": {"num_predict": new_tokens}} if route.startswith("/api") else {"max_tokens": new_tokens}
            sent_at = time.monotonic()
            leave = self.rng.uniform(0, LEAVE_WITHIN_S) if self.rng.random() < LEAVING_SHARE else None
            o = await send(client, "POST", self.url + route, self.args.request_deadline, leave, json=body)
            self.record(o, f"POST {route} {json.dumps(body)}", sent_at)
            if o.status in (503, None):  # no engine, busy, or no server: do not hammer it
                await asyncio.sleep(1.0)

    async def kill_engines(self, client: httpx.AsyncClient) -> None:
        last_kill_before, serving_since, last_kill = self.stop_at - self.args.duration / 4, self.started, self.started
        while (at := max(last_kill + self.args.kill_every, serving_since + STABLE_AFTER_S)) < last_kill_before:
            await asyncio.sleep(at - time.monotonic())
            engine = [pid for pid in descendants(self.server.pid) if any(m in cmdline(pid) for m in ENGINE_MODULES)]
            if not self.running() or not engine:
                return
            victim, last_kill = self.rng.choice(engine), time.monotonic()
            self.kills.append((last_kill, "scheduler" if ENGINE_MODULES[0] in cmdline(victim) else "worker"))
            os.kill(victim, signal.SIGKILL)
            await health_becomes(False, client, self.url, min(self.stop_at, last_kill + 10))  # the death noticed
            await health_becomes(True, client, self.url, self.stop_at)
            serving_since = time.monotonic()

    async def send_generated(self, client: httpx.AsyncClient, cases: queue.Queue) -> None:
        total, tasks = self.args.schemathesis_requests, []
        for i in range(total):
            await asyncio.sleep(max(0.0, self.started + i * self.args.duration / total - time.monotonic()))
            if not self.running():
                break
            with contextlib.suppress(queue.Empty):
                case = await asyncio.to_thread(cases.get, timeout=10)
                tasks.append(asyncio.create_task(self.send_one_generated(client, case)))
        await asyncio.gather(*tasks)

    async def send_one_generated(self, client: httpx.AsyncClient, case) -> None:
        request, sent_at = case.as_transport_kwargs(base_url=self.url), time.monotonic()  # requests' keywords
        content = json.dumps(request.pop("json")).encode() if "json" in request else request.pop("data", None)
        method, url, _ = request.pop("method"), request.pop("url"), request.pop("cookies", None)
        o = await send(client, method, url, self.args.request_deadline, None, content=content, **request)
        o.generated, self.generated_sent = True, self.generated_sent + 1
        self.record(o, f"{method} {url[len(self.url):]} {(content or b'')[:300]!r}", sent_at)


async def health_becomes(healthy: bool, client: httpx.AsyncClient, url: str, deadline: float) -> None:
    """Returns once /health says that an engine serves (healthy) or that none does, or at the deadline."""
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if ((await client.get(url + "/health")).status_code == 200) == healthy:
                return
        await asyncio.sleep(0.5)


async def wait_idle(client: httpx.AsyncClient, url: str, deadline: float) -> dict[str, float]:
    """/metrics' running, waiting and KV usage once an engine serves and holds nothing, or at the deadline."""
    await health_becomes(True, client, url, deadline)
    while True:
        text = (await client.get(url + "/metrics")).text
        state = {name: sum(float(v) for v in re.findall(rf"^vllm:{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE))
                 for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")}
        if not any(state.values()) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(1.0)


def rss_mib(pid: int) -> float:
    return int(re.search(r"^VmRSS:\s+(\d+) kB", pathlib.Path(f"/proc/{pid}/status").read_text(), re.M)[1]) / 1024


async def run(args, server: subprocess.Popen, url: str, log_path: pathlib.Path) -> int:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=args.concurrency + 16)
    async with httpx.AsyncClient(timeout=args.request_deadline + 30, limits=limits, trust_env=False) as client:
        model, rss_start = (await client.get(url + "/v1/models")).json()["data"][0]["id"], rss_mib(server.pid)
        document = naming_the_served_model((await client.get(url + "/openapi.json")).json(), model)
        schema = schemathesis.openapi.from_dict(capped(document))
        chaos, cases, stop = Chaos(args, url, model, server), queue.Queue(maxsize=8), threading.Event()
        threading.Thread(target=generate_until, args=(stop, schema, cases, random.Random(args.seed)),
                         daemon=True).start()
        engines_started = len(SERVING_LINE.findall(log_path.read_text()))
        try:
            await asyncio.gather(chaos.kill_engines(client), chaos.send_generated(client, cases),
                                 *(chaos.load_client(client) for _ in range(args.concurrency)))
        finally:
            stop.set()
        if server.poll() is not None:
            print(f"the server exited with {server.returncode}; its log: {log_path}")
            return 1
        state, rss_end = await wait_idle(client, url, time.monotonic() + 180), rss_mib(server.pid)
    num_blocks = int(re.findall(r"(\d+) KV blocks", log := log_path.read_text())[-1])  # the latest engine's pool
    blocks_in_use = round(state["kv_cache_usage_perc"] * num_blocks)
    c, kills, total = chaos.counts, collections.Counter(role for _, role in chaos.kills), sum(chaos.counts.values())
    rows = [("requests sent", f"{total} ({chaos.generated_sent} generated)"), ("accepted", total - c["rejected busy"]),
            *((kind, c[kind]) for kind in ("completed", "errored explicitly", "rejected busy", "rejected invalid",
                                           "left on purpose", "cut off silently", "hung", "unexpected 5xx")),
            ("KV blocks in use at end", f"{blocks_in_use} of {num_blocks}"),
            ("running / waiting at end", f"{state['num_requests_running']:.0f} / {state['num_requests_waiting']:.0f}"),
            ("frontend RSS start / end", f"{rss_start:.1f} / {rss_end:.1f} MiB"),
            ("engine kills done", f"{len(chaos.kills)} ({kills['scheduler']} scheduler, {kills['worker']} worker)"),
            ("engine restarts observed", len(SERVING_LINE.findall(log)) - engines_started)]
    print("\n| | |\n|---|---:|\n" + "\n".join(f"| {name} | {value} |" for name, value in rows))
    print("\nexplicit errors, most frequent first:\n"
          + "\n".join(f"  {n:6d}  {error}" for error, n in chaos.errors.most_common(8)))
    for kind, examples in chaos.examples.items():
        print(f"\nfirst {kind}:\n" + "\n".join(f"  {e}" for e in examples))
    print(f"\nserver log: {log_path}")
    bad = c["hung"] + c["unexpected 5xx"] + c["cut off silently"] + blocks_in_use
    return 1 if bad or state["num_requests_running"] or state["num_requests_waiting"] else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=1200, help="seconds of load")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--kill-every", type=float, default=120, help="seconds between engine kills")
    ap.add_argument("--schemathesis-requests", type=int, default=10000)
    ap.add_argument("--request-deadline", type=float, default=180, help="seconds before a request counts as hung")
    ap.add_argument("--server-args", default=DEFAULT_SERVER_ARGS, help="serve flags (replace the defaults)")
    ap.add_argument("--port", type=int, default=0, help="default: a free port")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="tinyvllm-chaos-"))
    port, log_path = args.port or free_port(), workdir / "server.log"
    cmd = [sys.executable, "-m", "tinyvllm.frontend.cli.main", "serve", "--port", str(port), "--models-dir",
           str(workdir / "models"), *shlex.split(args.server_args)]
    with open(log_path, "wb") as log:  # the child keeps its own copy of the file
        server = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "DEV": "CPU", "PYTHONUNBUFFERED": "1"}, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: server.poll() is not None or READY_LINE in log_path.read_text(errors="replace"),
                   STARTUP_TIMEOUT_S, 0.5)
        if server.poll() is not None or READY_LINE not in log_path.read_text(errors="replace"):
            print(f"the server is not ready (exit code {server.poll()}):\n{log_path.read_text()}")
            return 1
        return asyncio.run(run(args, server, f"http://127.0.0.1:{port}", log_path))
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)  # whatever of its session is left


if __name__ == "__main__":
    sys.exit(main())
