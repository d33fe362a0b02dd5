"""`tinyvllm router`: its flags, and its process (uvicorn on uvloop, drained on SIGTERM like `tinyvllm serve`)."""
import argparse
import asyncio
import logging
import os
import sys
from dataclasses import dataclass, field

import httpx
import uvloop

from tinyvllm.frontend.cli import API_KEY_ENV, resolve_api_key
from tinyvllm.frontend.request_gate import RequestGate
from tinyvllm.frontend.router.app import build_router_app
from tinyvllm.frontend.router.dns_discovery import parse_target
from tinyvllm.frontend.router.instance_monitor import InstanceMonitor
from tinyvllm.frontend.router.instance_picker import InstancePicker
from tinyvllm.frontend.router.instance_registry import STATIC, InstanceRegistry
from tinyvllm.frontend.router.router_metrics import RouterMetrics
from tinyvllm.frontend.router.upstream_proxy import Shutdown, UpstreamProxy
from tinyvllm.frontend.router_registration import ROUTER_SECRET_ENV, http_base_url
from tinyvllm.frontend.uvicorn_runner import QuietSignalServer, drain_on_signals, http_config, start_serving
from tinyvllm.protocol.worker_auth import is_loopback, resolve_secret

log = logging.getLogger("tinyvllm.router")

INSTANCE_API_KEY_ENV = "TINYVLLM_INSTANCE_API_KEY"
CONNECT_TIMEOUT_S = 5.0
DESCRIPTION = """One address in front of many `tinyvllm serve` instances: each request goes to the least loaded one,
or to one that recently served the same prompt prefix; streams pass through as they come.

  tinyvllm router --instances http://10.0.0.2:8000 http://10.0.0.3:8000
  tinyvllm serve --register-with http://10.0.0.1:8080 ...     # or let instances join while it runs
"""


def add_arguments(router: argparse.ArgumentParser) -> None:
    router.add_argument("--host", default="127.0.0.1",
                        help="address to bind; beyond loopback a register secret is required")
    router.add_argument("--port", type=int, default=8080, help="HTTP port")
    router.add_argument("--instances", nargs="+", default=[], metavar="URL",
                        help="instances to route to from the start (checked with GET /health every 2 s)")
    router.add_argument("--prefill", nargs="+", default=[], metavar="URL",
                        help="`serve --role prefill` instances, from the start: with --decode ones, completions and "
                             "chat go prefill then decode")
    router.add_argument("--decode", nargs="+", default=[], metavar="URL", help="`serve --role decode` instances")
    router.add_argument("--discover-dns", default=None, metavar="NAME:PORT",
                        help="resolve NAME (e.g. a Kubernetes headless Service) periodically; every address is an "
                             "instance http://ADDRESS:PORT")
    router.add_argument("--discover-interval", dest="discover_interval_s", type=float, default=5.0,
                        help="seconds between two resolutions of --discover-dns")
    router.add_argument("--heartbeat-timeout", dest="heartbeat_timeout_s", type=float, default=6.0,
                        help="seconds without a heartbeat after which a registered instance is dropped (instances "
                             "beat every 2 s)")
    router.add_argument("--api-key", default=None,
                        help=f"require `Authorization: Bearer <key>` on /v1 and /api; default: {API_KEY_ENV}")
    router.add_argument("--instance-api-key", default=None,
                        help=f"the key the instances require (`serve --api-key`), sent in place of the client's; "
                             f"default: {INSTANCE_API_KEY_ENV}, else the client's own Authorization is passed on")
    router.add_argument("--register-secret", default=None,
                        help=f"the bearer token /instances requires (registration, drain, listing); default: "
                             f"{ROUTER_SECRET_ENV}; required when --host is beyond loopback")
    router.add_argument("--max-waiting-requests", type=int, default=512,
                        help="generation requests that may wait for an instance's first answer before new ones get "
                             "503 with Retry-After")
    router.add_argument("--shutdown-timeout", dest="shutdown_timeout_s", type=float, default=30.0,
                        help="on SIGTERM or Ctrl-C, seconds open requests get to finish before the rest end with an "
                             "error")


@dataclass(slots=True)
class RouterArgs:
    host: str = "127.0.0.1"
    port: int = 8080
    instances: list[str] = field(default_factory=list)
    dns_target: tuple[str, int] | None = None
    discover_interval_s: float = 5.0
    heartbeat_timeout_s: float = 6.0
    api_key: str | None = None
    instance_api_key: str | None = None
    register_secret: str = ""
    max_waiting_requests: int = 512
    shutdown_timeout_s: float = 30.0
    prefill: list[str] = field(default_factory=list)
    decode: list[str] = field(default_factory=list)


def router_args_from(args: argparse.Namespace, environ) -> RouterArgs:
    """RouterArgs for the command's flags; ValueError naming the mistake."""
    if args.instance_api_key is not None and not args.instance_api_key:
        raise ValueError("--instance-api-key must not be empty")
    if args.discover_interval_s <= 0 or args.heartbeat_timeout_s <= 0:
        raise ValueError("--discover-interval and --heartbeat-timeout must be positive")
    if args.max_waiting_requests < 1 or args.shutdown_timeout_s < 0:
        raise ValueError("--max-waiting-requests must be at least 1 and --shutdown-timeout not negative")
    secret = resolve_secret(args.register_secret, environ, ROUTER_SECRET_ENV, "register secret")
    if not secret and not is_loopback(f"tcp://{args.host}:{args.port}"):
        raise ValueError(f"--host {args.host} is reachable from other machines, and anything listening beyond "
                         f"loopback authenticates its peers: set a register secret in {ROUTER_SECRET_ENV} (or "
                         f"--register-secret), the same for the router and every instance, e.g. "
                         f"`export {ROUTER_SECRET_ENV}=$(openssl rand -hex 32)`")
    return RouterArgs(args.host, args.port, [http_base_url(url, "--instances") for url in args.instances],
                      parse_target(args.discover_dns) if args.discover_dns else None, args.discover_interval_s,
                      args.heartbeat_timeout_s, resolve_api_key(args.api_key, environ),
                      args.instance_api_key or environ.get(INSTANCE_API_KEY_ENV) or None, secret,
                      args.max_waiting_requests, args.shutdown_timeout_s,
                      [http_base_url(url, "--prefill") for url in args.prefill],
                      [http_base_url(url, "--decode") for url in args.decode])


def run(args: argparse.Namespace) -> int:
    try:
        router_args = router_args_from(args, os.environ)
    except ValueError as e:
        print(f"tinyvllm: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s router %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per proxied request
    try:
        return uvloop.run(serve_router(router_args))
    except KeyboardInterrupt:
        return 0


async def serve_router(a: RouterArgs) -> int:
    """Routes until SIGTERM or SIGINT (then drains: 0), or until the HTTP server could not start (1)."""
    registry = InstanceRegistry(a.heartbeat_timeout_s, forget_after_s=max(a.heartbeat_timeout_s,
                                                                           3 * a.discover_interval_s))
    for role, urls in (("both", a.instances), ("prefill", a.prefill), ("decode", a.decode)):
        for url in urls:
            registry.add(url, STATIC, role)
    gate, shutdown = RequestGate(a.max_waiting_requests), Shutdown()
    # trust_env=False: instance traffic never goes through an HTTP_PROXY from the environment
    async with httpx.AsyncClient(timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=None, pool=None), trust_env=False,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=256)) as client:
        metrics = RouterMetrics(registry)
        proxy = UpstreamProxy(registry, InstancePicker(), client, metrics, shutdown, a.instance_api_key)
        app = build_router_app(registry, proxy, metrics, gate, a.api_key, a.register_secret or None)
        monitor = asyncio.create_task(InstanceMonitor(registry, client, a.dns_target, a.discover_interval_s).run())
        server = QuietSignalServer(http_config(app, a.host, a.port))
        serving = await start_serving(server)
        try:
            if not server.started:
                return 1
            print(f"tinyvllm router ready: routing at http://{a.host}:{a.port} ({len(a.instances) + len(a.prefill) + len(a.decode)} static instances"
                  f"{f', discovering {a.dns_target[0]}' if a.dns_target else ''})", flush=True)
            stop_asked = asyncio.Event()
            drain_on_signals(stop_asked, gate, server)
            stopping = asyncio.create_task(stop_asked.wait())
            await asyncio.wait((serving, stopping), return_when=asyncio.FIRST_COMPLETED)
            if stopping.done():
                log.info("draining: %d requests open; new ones get 503 (up to %g s)", gate.open, a.shutdown_timeout_s)
                if left := await gate.drain(a.shutdown_timeout_s, shutdown.fail_open):
                    log.warning("%d requests did not finish within --shutdown-timeout and ended with an error", left)
            stopping.cancel()
            server.should_exit = True
            await serving
            return 0
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
