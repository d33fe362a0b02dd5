"""The real `tinyvllm router` in front of a simulated fleet (benchmarks/fleet_instance.py), driven by multi-turn chats
that share prefixes; docs/SCALING.md has the numbers and what they mean.

Workload: --users clients (closed loop, or paced to --rate requests/s over all of them), each running conversations of
--turns turns one after another; a conversation opens with one of --system-prompts system prompts (~2,000 characters,
~500 tokens, shared by everyone) and each turn adds a ~300-character user message and sends the whole history, so a
turn's prompt repeats the previous turn's, and the answer (--output-tokens tokens, streamed) joins the history. Client
u talks to router u mod --routers, so a conversation stays on one router replica.

During the run one instance is drained (POST /instances/drain on every router) a third of the way in and another is
killed half way (it stops listening and cuts its connections). Checked afterwards (FleetResult.violations): every
request was answered once, by one instance; none sent after a drain or kill was acknowledged reached that instance; only
requests the killed instance held when it died failed.

Measured: router CPU (utime + stime of the router processes, /proc/PID/stat) per answered request, and its idle rate
(health checks and /metrics scrapes alone); router-added latency (the client's time for a request less the instance's
own time for it); TTFT as the client sees it and as the instance reports it; the prefix-cache hit rate (cached / prompt
tokens over all instances).

    python benchmarks/fleet_sim.py --instances 8 32 128 512 --routers 1 2 --policies cache-aware round-robin
"""
import argparse
import asyncio
import json
import math
import os
import pathlib
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import httpx
import uvloop

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.fleet_workload import Answer, Workload  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
INSTANCES_PER_PROCESS = 128
SECRET = "fleet-simulation-register-secret"
START_TIMEOUT_S = 120.0
POLICIES = ("cache-aware", "least-loaded", "round-robin")


@dataclass
class FleetConfig:
    instances: int = 32
    routers: int = 1
    policy: str = "cache-aware"
    users: int = 64
    rate: float | None = None  # requests/s over all users; None: closed loop
    duration_s: float = 10.0
    system_prompts: int = 8
    turns: int = 6
    output_tokens: int = 16
    cache_blocks: int = 4096
    speedup: float = 1.0
    drain_and_kill: bool = True
    min_requests: int = 0  # the load goes on past duration_s until this many requests were answered
    idle_measure_s: float = 3.0  # before the load: the router's CPU for health checks alone
    seed: int = 0


@dataclass
class FleetResult:
    config: FleetConfig
    answers: list[Answer]
    reports: list[dict]
    router_cpu_s: float
    idle_cpu_per_s: float
    router_rss_mb: float
    load_s: float
    drained: tuple[int, float] | None = None  # (instance, when every router acknowledged)
    killed: tuple[int, float] | None = None

    @property
    def ok(self) -> list[Answer]:
        return [a for a in self.answers if a.error is None]

    @property
    def hit_rate(self) -> float:
        prompt = sum(r["prompt_tokens"] for r in self.reports)
        return sum(r["cached_tokens"] for r in self.reports) / prompt if prompt else 0.0

    def violations(self) -> list[str]:
        """What broke the invariants (empty when none did)."""
        found, sent = [], {a.request_id: a.sent for a in self.answers}
        receipts: dict[str, list[tuple[int, float]]] = {}
        for report in self.reports:
            for request_id, when in report["received"]:
                receipts.setdefault(request_id, []).append((report["index"], when))
        def held_by_the_killed(receipt: tuple[int, float]) -> bool:
            return self.killed is not None and receipt[0] == self.killed[0] and receipt[1] < self.killed[1]

        if len(sent) != len(self.answers):
            found.append("a request id was sent twice")
        for a in self.answers:
            got = receipts.get(a.request_id, [])
            if a.error is None:
                others = [r for r in got if r[0] != a.instance]
                if len(got) - len(others) != 1 or not all(map(held_by_the_killed, others)):
                    found.append(f"{a.request_id} answered by {a.instance}, received by {got}")
            elif not any(map(held_by_the_killed, got)):
                found.append(f"{a.request_id} failed ({a.error}) but the killed instance never held it")
        for gone in (self.drained, self.killed):
            if gone is None:
                continue
            index, acknowledged = gone
            late = [request_id for request_id, whens in receipts.items()
                    if any(i == index for i, _ in whens) and sent.get(request_id, 0) > acknowledged]
            if late:
                found.append(f"instance {index} received {len(late)} requests sent after it was drained or killed")
        return found

    def row(self) -> dict[str, str]:
        ok = self.ok
        added = [a.ended - a.sent - a.record["service_s"] for a in ok]
        ttft = [a.first_byte - a.sent for a in ok]
        offered = f"{self.config.rate:g}/s" if self.config.rate else f"{self.config.users} users"
        return {"instances": str(self.config.instances), "routers": str(self.config.routers),
                "policy": self.config.policy, "offered": offered, "req/s": f"{len(ok) / self.load_s:.0f}",
                "router CPU ms/req": f"{1000 * self.router_cpu_s / max(1, len(ok)):.2f}",
                "less idle": f"{1000 * (self.router_cpu_s - self.idle_cpu_per_s * self.load_s) / max(1, len(ok)):.2f}",
                "router idle CPU ms/s": f"{1000 * self.idle_cpu_per_s:.0f}",
                "router RSS MB": f"{self.router_rss_mb:.0f}",
                "added p50/p99 ms": f"{1000 * percentile(added, 50):.1f} / {1000 * percentile(added, 99):.1f}",
                "hit rate": f"{100 * self.hit_rate:.1f}%",
                "TTFT p50/p99 ms": f"{1000 * percentile(ttft, 50):.0f} / {1000 * percentile(ttft, 99):.0f}",
                "instance TTFT p50/p99 ms": (f"{1000 * percentile([a.record['ttft_s'] for a in ok], 50):.0f} / "
                                             f"{1000 * percentile([a.record['ttft_s'] for a in ok], 99):.0f}"),
                "failed": str(len(self.answers) - len(ok))}


def percentile(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def markdown(rows: list[dict[str, str]]) -> str:
    head = list(rows[0])
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(row[k] for k in head) + " |" for row in rows])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Fleet:
    """The simulated instances' processes and the routers in front of them; stop() ends every one."""

    def __init__(self, config: FleetConfig, workdir: pathlib.Path):
        self.config, self.workdir = config, workdir
        self.sims: list[tuple[subprocess.Popen, int, int]] = []  # (process, control port, first instance)
        self.urls: list[str] = []
        self.routers: list[tuple[subprocess.Popen, int]] = []

    def start(self) -> None:
        c = self.config
        processes = max(1, math.ceil(c.instances / INSTANCES_PER_PROCESS))
        sizes = [c.instances // processes + (k < c.instances % processes) for k in range(processes)]
        first = 0
        for size in sizes:
            proc = subprocess.Popen(
                [sys.executable, str(HERE / "fleet_instance.py"), "--count", str(size), "--first-index", str(first),
                 "--cache-blocks", str(c.cache_blocks), "--speedup", str(c.speedup)],
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
            self.sims.append((proc, 0, first))
            first += size
        for k, (proc, _, first) in enumerate(self.sims):
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("a simulated instance process did not start")
            ready = json.loads(line)
            self.sims[k] = (proc, ready["control"], first)
            self.urls += [f"http://127.0.0.1:{port}" for port in ready["ports"]]
        env = {**os.environ, "TINYVLLM_ROUTER_SECRET": SECRET, "PYTHONUNBUFFERED": "1"}
        for r in range(c.routers):
            port = free_port()
            log = open(self.workdir / f"router{r}.log", "wb")
            proc = subprocess.Popen(
                [sys.executable, "-m", "tinyvllm.frontend.cli.main", "router", "--port", str(port),
                 "--routing-policy", c.policy, "--max-waiting-requests", "100000", "--shutdown-timeout", "1",
                 "--instances", *self.urls],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            self.routers.append((proc, port))

    def router_log(self, r: int) -> str:
        return (self.workdir / f"router{r}.log").read_text(errors="replace")[-3000:]

    async def wait_routable(self, client: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        for r, (proc, port) in enumerate(self.routers):
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"router {r} did not route to every instance:\n{self.router_log(r)}")
                try:
                    rows = (await client.get(f"http://127.0.0.1:{port}/instances", headers=self.auth)).json()
                    if sum(row["state"] == "routable" for row in rows["instances"]) == len(self.urls):
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {SECRET}"}

    def router_cpu(self) -> float:
        return sum(cpu_seconds(proc.pid) for proc, _ in self.routers)

    async def drain(self, client: httpx.AsyncClient, index: int) -> float:
        for _, port in self.routers:
            reply = await client.post(f"http://127.0.0.1:{port}/instances/drain", json={"url": self.urls[index]},
                                      headers=self.auth)
            reply.raise_for_status()
        return time.monotonic()

    def _control(self, index: int) -> tuple[int, int]:
        for _, control, first in reversed(self.sims):
            if index >= first:
                return control, index - first
        raise IndexError(index)

    async def kill(self, client: httpx.AsyncClient, index: int) -> float:
        control, local = self._control(index)
        (await client.post(f"http://127.0.0.1:{control}/kill/{local}")).raise_for_status()
        return time.monotonic()

    async def reports(self, client: httpx.AsyncClient) -> list[dict]:
        found = []
        for _, control, _ in self.sims:
            found += (await client.get(f"http://127.0.0.1:{control}/report", timeout=60)).json()
        return found

    def stop(self) -> None:
        processes = [proc for proc, _ in self.routers] + [proc for proc, _, _ in self.sims]
        for proc in processes:
            if proc.poll() is None:
                proc.terminate()
        for proc in processes:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if proc.stdout is not None:
                proc.stdout.close()


async def run_fleet(config: FleetConfig) -> FleetResult:
    with tempfile.TemporaryDirectory(prefix="fleet-sim-") as workdir:
        fleet = Fleet(config, pathlib.Path(workdir))
        try:
            fleet.start()
            return await _measure(fleet, config)
        finally:
            fleet.stop()


async def _measure(fleet: Fleet, config: FleetConfig) -> FleetResult:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        await fleet.wait_routable(client)
        idle_from = fleet.router_cpu()
        await asyncio.sleep(config.idle_measure_s)
        idle_cpu_per_s = (fleet.router_cpu() - idle_from) / config.idle_measure_s if config.idle_measure_s else math.nan
        workload = Workload(config, [port for _, port in fleet.routers])
        events: dict[str, tuple[int, float]] = {}

        async def drain_then_kill() -> None:
            victims = random.Random(config.seed).sample(range(config.instances), 2)
            await asyncio.sleep(config.duration_s / 3)
            events["drained"] = (victims[0], await fleet.drain(client, victims[0]))
            await asyncio.sleep(config.duration_s / 2 - config.duration_s / 3)
            events["killed"] = (victims[1], await fleet.kill(client, victims[1]))

        cpu_from, started = fleet.router_cpu(), time.monotonic()
        disruption = asyncio.create_task(drain_then_kill()) if config.drain_and_kill else None
        await workload.run(config.duration_s)
        load_s = time.monotonic() - started
        router_cpu_s = fleet.router_cpu() - cpu_from
        if disruption is not None:
            await disruption
        return FleetResult(config, workload.answers, await fleet.reports(client), router_cpu_s, idle_cpu_per_s,
                           max(rss_mb(proc.pid) for proc, _ in fleet.routers), load_s,
                           events.get("drained"), events.get("killed"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--routers", type=int, nargs="+", default=[1])
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--users", type=int, default=64, help="clients, each one conversation at a time")
    parser.add_argument("--rate", type=float, default=None, help="requests/s over all clients (default: closed loop)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per run")
    parser.add_argument("--system-prompts", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--cache-blocks", type=int, default=4096, help="prefix-cache blocks per instance")
    parser.add_argument("--speedup", type=float, default=1.0, help="divides the simulated step times")
    parser.add_argument("--no-disruption", action="store_true", help="neither drain nor kill an instance")
    args = parser.parse_args()
    rows, broken = [], False
    for instances in args.instances:
        for routers in args.routers:
            for policy in args.policies:
                config = FleetConfig(instances, routers, policy, args.users, args.rate, args.duration,
                                     args.system_prompts, args.turns, args.output_tokens, args.cache_blocks,
                                     args.speedup, not args.no_disruption)
                result = uvloop.run(run_fleet(config))
                rows.append(result.row())
                print(markdown(rows[-1:]), flush=True)
                for violation in result.violations()[:10]:
                    broken = True
                    print("VIOLATION:", violation, flush=True)
    print("\n" + markdown(rows))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
