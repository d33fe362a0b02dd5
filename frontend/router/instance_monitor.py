"""The router's background work on its instances: heartbeat expiry, health checks, DNS discovery.

- Every SWEEP_INTERVAL_S, registered instances whose heartbeats stopped for --heartbeat-timeout are removed (they
  stop being routable the moment their last beat is that old, sweep or not).
- Every HEALTH_INTERVAL_S each static and DNS instance gets GET /health (200: routable; 503 or no answer: not) and,
  when healthy, GET /metrics for its load (vLLM's running and waiting gauges, summed over its engines); the
  connection pools and prefix memories of instances that left are dropped.
- Every --discover-interval each DNS name (one per role: --discover-dns, --discover-prefill-dns,
  --discover-decode-dns) is resolved again: new addresses join with that role, vanished ones are drained. A name
  that does not resolve leaves its instances as they were (a DNS hiccup must not empty the router); instances really
  gone fail their health checks anyway.
"""
import asyncio
import logging
import math
import re
import socket

import httpx

from tinyvllm.frontend.router.dns_discovery import resolve_instances
from tinyvllm.frontend.router.instance_clients import InstanceClients
from tinyvllm.frontend.router.instance_picker import InstancePicker
from tinyvllm.frontend.router.instance_registry import DNS, STATIC, InstanceRegistry, Load

log = logging.getLogger("tinyvllm.router")

SWEEP_INTERVAL_S = 0.5
HEALTH_INTERVAL_S = 2.0


# The three gauges' samples, found without parsing the rest of the page: prometheus_client's parser took ~10 ms for a
# tinyvllm server's 16 KB /metrics (histograms), which at 512 instances every 2 s is more than a core.
_LOAD_SAMPLE = re.compile(r"^vllm:(num_requests_running|num_requests_waiting|kv_cache_usage_perc|gpu_cache_usage_perc)"
                          r"[ \t]*(?:\{.*\})?[ \t]+(\S+)", re.MULTILINE)


def load_from_metrics(text: str) -> Load:
    """An instance's load from its /metrics text (a tinyvllm or vLLM server); ValueError for a value that is no
    finite number, or a page without any of the gauges."""
    running = waiting = 0.0
    kv = []
    samples = _LOAD_SAMPLE.findall(text)
    if text.strip() and not samples:  # an error page, or no vLLM-compatible server: not an idle instance
        raise ValueError("the page has none of vLLM's running, waiting or KV-cache gauges")
    for name, text_value in samples:
        if not math.isfinite(value := float(text_value)):
            raise ValueError(f"vllm:{name} is {text_value}")
        if name == "num_requests_running":
            running += value
        elif name == "num_requests_waiting":
            waiting += value
        else:
            kv.append(value)
    return Load(int(running), int(waiting), sum(kv) / len(kv) if kv else 0.0)


class InstanceMonitor:
    def __init__(self, registry: InstanceRegistry, clients: InstanceClients,
                 dns_targets: dict[str, tuple[str, int]] | None = None, discover_interval_s: float = 5.0,
                 health_interval_s: float = HEALTH_INTERVAL_S, picker: InstancePicker | None = None):
        """dns_targets: {role: (NAME, PORT)}, each name's addresses instances of that role; picker: whose memory of
        departed instances is dropped with their connection pools."""
        self.registry, self.clients, self.dns_targets = registry, clients, dict(dns_targets or {})
        self.picker = picker
        self.discover_interval_s, self.health_interval_s = discover_interval_s, health_interval_s
        self._dns_failing: set[str] = set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._every(SWEEP_INTERVAL_S, self._sweep))
            tasks.create_task(self._every(self.health_interval_s, self.check_health))
            if self.dns_targets:
                tasks.create_task(self._every(self.discover_interval_s, self.discover))

    @staticmethod
    async def _every(interval_s: float, work) -> None:
        while True:
            try:
                await work()
            except Exception:
                log.exception("router background work failed; trying again in %g s", interval_s)
            await asyncio.sleep(interval_s)

    async def _sweep(self) -> None:
        for instance in self.registry.sweep():
            log.warning("instance %s sent no heartbeat for %g s: removed", instance.url,
                        self.registry.heartbeat_timeout_s)

    async def check_health(self) -> None:
        checked = [i.url for i in self.registry.all() if i.source in (STATIC, DNS) and not i.leaving]
        await asyncio.gather(*(self._check(url) for url in checked))
        members = {i.url for i in self.registry.all()}
        await self.clients.keep(members)
        if self.picker is not None:
            self.picker.keep(members)

    async def _check(self, url: str) -> None:
        timeout = self.health_interval_s
        try:
            health = await self.clients.of(url).get(url + "/health", timeout=timeout)
            load = None
            if health.status_code == 200:
                metrics = await self.clients.of(url).get(url + "/metrics", timeout=timeout)
                load = load_from_metrics(metrics.text) if metrics.status_code == 200 else None
            healthy = health.status_code == 200
        except (httpx.HTTPError, ValueError) as e:
            healthy, load = False, None
            log.debug("health check of %s failed: %r", url, e)
        self.registry.health_checked(url, healthy, load)

    async def discover(self) -> None:
        await asyncio.gather(*(self._discover(role, name, port) for role, (name, port) in self.dns_targets.items()))

    async def _discover(self, role: str, name: str, port: int) -> None:
        try:
            urls = await resolve_instances(name, port)
        except (socket.gaierror, OSError) as e:
            if name not in self._dns_failing:
                log.warning("%s does not resolve (%s); keeping the instances known so far", name, e)
            self._dns_failing.add(name)
            return
        self._dns_failing.discard(name)
        self.registry.sync_dns(urls, role)
