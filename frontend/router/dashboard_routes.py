"""The router's /dashboard: `tinyvllm serve`'s page (frontend/api/dashboard.html), fed by every instance's
/dashboard/snapshot: the counts, KV blocks and batches summed over the instances, one panel per instance (its URL,
role and state, or why it could not be read), and the router's own history of their summed tokens/s and mean TTFT.

A snapshot asks every known instance at once, each within INSTANCE_TIMEOUT_S (the whole answer, at most
MAX_SNAPSHOT_BYTES, checked for shape), so one slow or misbehaving instance delays it by that at most and shows as
"not read"; viewers share one snapshot per interval. The router sends the key the instances require
(--instance-api-key, else its own --api-key); it never reaches the page. Without --api-key on the router, anyone who
reaches it sees the instances' dashboards, as its /v1 routes serve their models.
"""
import asyncio
import json
import time
from collections import deque

import httpx

from tinyvllm.frontend.api.dashboard import page_routes
from tinyvllm.frontend.api.dashboard_snapshot import HISTORY_POINTS, SAMPLE_INTERVAL_S
from tinyvllm.frontend.router.instance_clients import InstanceClients
from tinyvllm.frontend.router.instance_registry import ROUTABLE, Instance, InstanceRegistry
from tinyvllm.protocol.batch_summary import MAX_SUMMARIZED_REQUESTS

INSTANCE_TIMEOUT_S = 2.0
MAX_SNAPSHOT_BYTES = 1 << 20  # an instance's snapshot is a few KB; more is not a snapshot


def empty_panel() -> dict:
    return {"running": 0, "waiting": 0, "preemptions": 0, "kv_blocks": {"used": 0, "cached": 0, "free": 0, "total": 0},
            "prefix_cache": {"queries": 0, "hits": 0, "hit_rate": None}, "batch": [], "batch_truncated": False}


class _NotRead(Exception):
    pass


def check_snapshot(s) -> None:
    """Raises unless `s` has the shape the page and the sums need (an instance is another process: trust nothing)."""
    counts = [s[k] for k in ("running", "waiting", "preemptions")] + [s["kv_blocks"][k] for k in empty_panel()["kv_blocks"]] \
        + [s["prefix_cache"][k] for k in ("queries", "hits")]
    h = s["history"]
    if not (all(type(c) is int for c in counts) and isinstance(s["batch"], list) and isinstance(s["batch_truncated"], bool)
            and isinstance(s["model"], str) and len(h["time"]) == len(h["tokens_per_s"]) == len(h["ttft_s"])
            and all(isinstance(r, dict) for r in s["batch"])):
        raise ValueError("malformed snapshot")


def panel_of(snapshot: dict) -> dict:
    """The engine-summed part of an instance's snapshot (its per-replica panels stay on its own dashboard)."""
    return {key: snapshot[key] for key in empty_panel()}


def combine(panels: list[dict]) -> dict:
    """The instances' panels summed: counts, KV blocks and prefix-cache totals; their batches, up to the bound."""
    total = empty_panel()
    for p in panels:
        for key in ("running", "waiting", "preemptions"):
            total[key] += p[key]
        for part in total["kv_blocks"]:
            total["kv_blocks"][part] += p["kv_blocks"][part]
        for part in ("queries", "hits"):
            total["prefix_cache"][part] += p["prefix_cache"][part]
        total["batch"] += p["batch"]
        total["batch_truncated"] |= p["batch_truncated"]
    queries = total["prefix_cache"]["queries"]
    total["prefix_cache"]["hit_rate"] = total["prefix_cache"]["hits"] / queries if queries else None
    total["batch_truncated"] |= len(total["batch"]) > MAX_SUMMARIZED_REQUESTS
    total["batch"] = total["batch"][:MAX_SUMMARIZED_REQUESTS]
    return total


class RouterDashboard:
    def __init__(self, registry: InstanceRegistry, clients: InstanceClients, authorization: bytes | None,
                 clock=time.monotonic):
        self.registry, self.clients, self.clock = registry, clients, clock
        self.headers = {"authorization": authorization.decode()} if authorization else {}
        self.points: deque[tuple[float, float, float | None]] = deque(maxlen=HISTORY_POINTS)
        self._last_point = float("-inf")
        self._latest: tuple[float, asyncio.Future] | None = None  # one fan-out per interval, however many watch

    async def _read(self, instance: Instance) -> dict:
        """The instance's snapshot, or {"error": why} when it cannot be read in time, whole and well-formed."""
        try:
            snapshot = await asyncio.wait_for(self._fetch(instance.url), INSTANCE_TIMEOUT_S)
            check_snapshot(snapshot)
            return snapshot
        except TimeoutError:
            return {"error": "no answer in time"}
        except _NotRead as e:
            return {"error": str(e)}
        except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as e:
            return {"error": f"unreadable: {type(e).__name__}"}

    async def _fetch(self, url: str):
        async with self.clients.of(url).stream("GET", f"{url}/dashboard/snapshot", headers=self.headers) as reply:
            if reply.status_code != 200:
                raise _NotRead(f"HTTP {reply.status_code}")
            body = bytearray()
            async for chunk in reply.aiter_bytes():
                body += chunk
                if len(body) > MAX_SNAPSHOT_BYTES:
                    raise _NotRead("snapshot too large")
        return json.loads(body)

    def _sample(self, snapshots: list[dict]) -> None:
        """One history point a sample interval at most: the instances' latest tokens/s summed, their TTFTs' mean."""
        if self.clock() - self._last_point < SAMPLE_INTERVAL_S:
            return
        latest = [(h["tokens_per_s"][-1], h["ttft_s"][-1]) for s in snapshots if (h := s.get("history")) and h["time"]]
        ttfts = [t for _, t in latest if t is not None]
        self.points.append((round(time.time(), 3), round(sum(tps for tps, _ in latest), 2),
                            round(sum(ttfts) / len(ttfts), 4) if ttfts else None))
        self._last_point = self.clock()

    async def snapshot(self) -> dict:
        """The latest snapshot, taken again once it is SAMPLE_INTERVAL_S old (shared by every viewer meanwhile)."""
        if self._latest is None or self.clock() - self._latest[0] >= SAMPLE_INTERVAL_S:
            self._latest = (self.clock(), asyncio.ensure_future(self._take()))
        return await asyncio.shield(self._latest[1])

    async def _take(self) -> dict:
        instances = self.registry.all()
        snapshots = await asyncio.gather(*(self._read(i) for i in instances))
        read = [s for s in snapshots if "error" not in s]
        self._sample(read)
        panels = []
        for instance, s in zip(instances, snapshots):
            state = self.registry.state(instance)
            panels.append({"engine": instance.url, "instance": f"{instance.url} ({instance.role}, {state})",
                           **(empty_panel() if "error" in s else panel_of(s)), "error": s.get("error")})
        models = sorted({s["model"] for s in read if s.get("model")})
        serving = any(self.registry.state(i) == ROUTABLE for i in instances)
        return {"model": ", ".join(models) or "(no instance answered)", "time": round(time.time(), 3),
                "engine_dead": None if serving else "no instance can take requests",
                **combine([panel_of(s) for s in read]), "replicas": panels,
                "history": {"time": [p[0] for p in self.points], "tokens_per_s": [p[1] for p in self.points],
                            "ttft_s": [p[2] for p in self.points]}}


def router_dashboard_routes(registry: InstanceRegistry, clients: InstanceClients, gate, api_key: str | None,
                            instance_authorization: bytes | None) -> list:
    authorization = instance_authorization or (f"Bearer {api_key}".encode() if api_key else None)
    return page_routes(RouterDashboard(registry, clients, authorization).snapshot, gate, api_key)
