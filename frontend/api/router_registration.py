"""`tinyvllm serve --register-with http://ROUTER`: this server's heartbeats to a `tinyvllm router`.

Every HEARTBEAT_INTERVAL_S the frontend POSTs /instances/heartbeat {url, role, model, running, waiting, kv_usage,
draining} to the router, with the register secret as a bearer token; the router forgets an instance after its
--heartbeat-timeout without one (3 missed beats). No beat goes out while no engine serves, so the router stops
routing here. When the drain starts one beat says so at once (the router stops sending new requests); once the
drain is over, POST /instances/deregister takes this server out of the router's list.
"""
import argparse
import asyncio
import ipaddress
import logging
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from tinyvllm.protocol.messages import SchedulerStats
from tinyvllm.protocol.transport import local_ip_towards
from tinyvllm.protocol.worker_auth import resolve_secret

log = logging.getLogger("tinyvllm.frontend")

ROUTER_SECRET_ENV = "TINYVLLM_ROUTER_SECRET"
HEARTBEAT_INTERVAL_S = 2.0
HEARTBEAT_PATH, DEREGISTER_PATH = "/instances/heartbeat", "/instances/deregister"
ROLE = "both"  # prefill and decode in one instance (serve --role: both, prefill or decode)
REQUEST_TIMEOUT_S = 5.0


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--register-with", default=None, metavar="URL",
                       help="a `tinyvllm router` (e.g. http://10.0.0.1:8080) to join: heartbeats every 2 s while the "
                            "engine serves, and leaving it on shutdown once the drain is over")
    serve.add_argument("--advertise-url", default=None, metavar="URL",
                       help="where the router reaches this server; default: http://<--host>:<--port>, or with --host "
                            "0.0.0.0 this machine's address on the route to the router")
    serve.add_argument("--register-secret", default=None,
                       help=f"the router's register secret (sent as a bearer token); default: the "
                            f"{ROUTER_SECRET_ENV} environment variable, which other users cannot see in ps")


@dataclass(frozen=True, slots=True)
class Registration:
    router_url: str
    advertise_url: str
    secret: str


def http_base_url(url: str, flag: str) -> str:
    """url without a trailing slash; ValueError unless it is http(s)://host[:port] with nothing else."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment:
        raise ValueError(f"{flag} {url!r} is not a base URL such as http://10.0.0.1:8080")
    return url.rstrip("/")


def registration_from(register_with: str | None, advertise_url: str | None, secret_flag: str | None, host: str,
                      port: int, environ) -> Registration | None:
    """The serve flags' registration, or None without --register-with; ValueError on a mistake."""
    if register_with is None:
        if advertise_url is not None:
            raise ValueError("--advertise-url needs --register-with")
        return None
    router_url = http_base_url(register_with, "--register-with")
    secret = resolve_secret(secret_flag, environ, ROUTER_SECRET_ENV, "register secret")
    advertise = http_base_url(advertise_url, "--advertise-url") if advertise_url else \
        default_advertise_url(host, port, router_url)
    return Registration(router_url, advertise, secret)


def default_advertise_url(host: str, port: int, router_url: str) -> str:
    try:
        wildcard = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        wildcard = False
    if wildcard:
        router = urllib.parse.urlsplit(router_url)
        host = local_ip_towards(f"tcp://{router.hostname}:{router.port or 80}")
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class RouterHeartbeat:
    """stats(): the engines' summed SchedulerStats; serving(): whether an engine serves; draining(): whether the
    server drains."""

    def __init__(self, registration: Registration, model: str, stats: Callable[[], SchedulerStats],
                 serving: Callable[[], bool], draining: Callable[[], bool],
                 interval_s: float = HEARTBEAT_INTERVAL_S, transport: httpx.AsyncBaseTransport | None = None,
                 role: str = ROLE):
        self.registration, self.model, self.interval_s, self.role = registration, model, interval_s, role
        self._stats, self._serving, self._draining = stats, serving, draining
        headers = {"Authorization": f"Bearer {registration.secret}"} if registration.secret else {}
        self._client = httpx.AsyncClient(base_url=registration.router_url, headers=headers, transport=transport,
                                         timeout=REQUEST_TIMEOUT_S)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._failing: str | None = None  # the last failure, logged once until a beat gets through

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def wake(self) -> None:
        """Beat now (the drain started)."""
        self._wake.set()

    async def leave(self) -> None:
        """Stops beating and deregisters (after the drain, or when the server stops)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            reply = await self._client.post(DEREGISTER_PATH, json={"url": self.registration.advertise_url})
            if reply.status_code not in (200, 404):  # 404: the router had already let it go (an operator's drain)
                log.warning("the router %s refused to deregister this server: %d %s", self.registration.router_url,
                            reply.status_code, reply.text[:200])
        except httpx.HTTPError as e:
            log.warning("could not deregister from the router %s: %r", self.registration.router_url, e)
        finally:
            await self._client.aclose()

    async def _run(self) -> None:
        while True:
            if self._serving():
                await self._beat()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            except TimeoutError:
                pass

    async def _beat(self) -> None:
        stats = self._stats()
        report = {"url": self.registration.advertise_url, "role": self.role, "model": self.model,
                  "running": stats.num_running, "waiting": stats.num_waiting, "kv_usage": stats.kv_usage,
                  "draining": self._draining()}
        try:
            reply = await self._client.post(HEARTBEAT_PATH, json=report)
            failure = None if reply.status_code == 200 else f"{reply.status_code} {reply.text[:200]}"
        except httpx.HTTPError as e:
            failure = repr(e)
        if failure is not None and self._failing is None:
            log.warning("heartbeat to the router %s failed (logged once until one gets through): %s",
                        self.registration.router_url, failure)
        elif failure is None and self._failing is not None:
            log.info("heartbeats reach the router %s again", self.registration.router_url)
        self._failing = failure
