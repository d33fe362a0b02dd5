"""`tinyvllm router`: its flags, and its process (uvicorn on uvloop, drained on SIGTERM like `tinyvllm serve`)."""
import argparse
import asyncio
import logging
import os
import pathlib
import sys
import dataclasses
from dataclasses import dataclass

import httpx
import uvloop

from tinyvllm.frontend.api.auth import API_KEY_ENV, resolve_api_key
from tinyvllm.frontend.api.request_gate import RequestGate
from tinyvllm.frontend.engine.replica_router import CACHE_AWARE, ROUTING_MODES, RoutingPolicy
from tinyvllm.frontend.router.app import build_router_app
from tinyvllm.frontend.router.dns_discovery import parse_target
from tinyvllm.frontend.router.instance_clients import InstanceClients
from tinyvllm.frontend.router.instance_monitor import InstanceMonitor
from tinyvllm.frontend.router.instance_picker import InstancePicker
from tinyvllm.frontend.router.instance_registry import STATIC, InstanceRegistry
from tinyvllm.frontend.router.kv_event_streams import KVEventStreams
from tinyvllm.frontend.router.prompt_tokens import TokenizedPrompts
from tinyvllm.frontend.router.router_metrics import RouterMetrics
from tinyvllm.frontend.router.upstream_proxy import Shutdown, UpstreamProxy, chunk_hashes_of
from tinyvllm.frontend.api.router_registration import ROUTER_SECRET_ENV, http_base_url
from tinyvllm.frontend.api.uvicorn_runner import QuietSignalServer, http_config, serve_until_drained, start_serving
from tinyvllm.protocol.knobs import add_flags, knob, knobs_of, options_from
from tinyvllm.protocol.model_path import resolve_model_path
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
    add_flags(router, ROUTER_KNOBS)


def _urls(help: str) -> list[str]:
    return knob(None, help, nargs="+", metavar="URL", default_factory=list)


@dataclass(slots=True)
class RouterArgs:
    """`tinyvllm router`'s options (its flags are made from these declarations, protocol/knobs.py)."""
    host: str = knob("127.0.0.1", "address to bind; beyond loopback a register secret is required")
    port: int = knob(8080, "HTTP port")
    instances: list[str] = _urls("instances to route to from the start (checked with GET /health every 2 s)")
    prefill: list[str] = _urls("`serve --role prefill` instances, from the start: with --decode ones, completions and "
                               "chat go prefill then decode")
    decode: list[str] = _urls("`serve --role decode` instances")
    discover_dns: tuple[str, int] | None = knob(
        None, "resolve NAME (e.g. a Kubernetes headless Service) periodically; every address is an instance "
              "http://ADDRESS:PORT", parse=parse_target, flag_type=str, metavar="NAME:PORT")
    discover_prefill_dns: tuple[str, int] | None = knob(
        None, "as --discover-dns, for `serve --role prefill` instances (with --discover-decode-dns: disaggregated "
              "prefill and decode found without registration, so any number of routers serve the same fleet)",
        parse=parse_target, flag_type=str, metavar="NAME:PORT")
    discover_decode_dns: tuple[str, int] | None = knob(
        None, "as --discover-dns, for `serve --role decode` instances", parse=parse_target, flag_type=str,
        metavar="NAME:PORT")
    discover_interval_s: float = knob(5.0, "seconds between two resolutions of each --discover-*-dns name",
                                      flag="--discover-interval")
    heartbeat_timeout_s: float = knob(6.0, "seconds without a heartbeat after which a registered instance is dropped "
                                           "(instances beat every 2 s)", flag="--heartbeat-timeout")
    api_key: str | None = knob(None, f"require `Authorization: Bearer <key>` on /v1 and /api; default: {API_KEY_ENV}",
                               secret=True)
    instance_api_key: str | None = knob(
        None, f"the key the instances require (`serve --api-key`), sent in place of the client's; default: "
              f"{INSTANCE_API_KEY_ENV}, else the client's own Authorization is passed on", secret=True)
    register_secret: str = knob("", f"the bearer token /instances requires (registration, drain, listing); default: "
                                    f"{ROUTER_SECRET_ENV}; required when --host is beyond loopback", cli_default=None,
                                secret=True)
    max_waiting_requests: int = knob(512, "generation requests that may wait for an instance's first answer before "
                                          "new ones get 503 with Retry-After")
    routing_policy: str = knob(CACHE_AWARE, "how an instance is chosen: cache-aware (the longest remembered prompt "
                                            "prefix unless that instance is overloaded, else the least loaded), "
                                            "least-loaded (prefixes ignored), round-robin (load ignored too)",
                               choices=ROUTING_MODES)
    tokenizer: str | None = knob(
        None, "the instances' model, for its tokenizer and chat template only: their .gguf file, or a folder with "
              "its tokenizer.json and tokenizer_config.json: with it, cache-aware routing keys OpenAI prompts by the "
              "instances' own KV block hashes and follows each instance's GET /kv_events (instances started with "
              "--kv-events-config), so every router replica knows which instance holds a prefix, whichever replica "
              "routed it", metavar="MODEL")
    shutdown_timeout_s: float = knob(30.0, "on SIGTERM or Ctrl-C, seconds open requests get to finish before the "
                                           "rest end with an error", flag="--shutdown-timeout")


    @property
    def dns_targets(self) -> dict[str, tuple[str, int]]:
        """{role: (NAME, PORT)} of each name to discover instances of that role by."""
        targets = {"both": self.discover_dns, "prefill": self.discover_prefill_dns, "decode": self.discover_decode_dns}
        return {role: target for role, target in targets.items() if target is not None}


ROUTER_KNOBS = knobs_of(RouterArgs)


def tokenizer_path(name: str) -> str:
    """A folder with the model's tokenizer.json (its tokenizer_config.json has the chat template) as it is, or what
    `serve --model` accepts (a .gguf file, a model folder, the default model's name)."""
    folder = pathlib.Path(name).expanduser()
    if folder.is_dir() and (folder / "tokenizer.json").is_file():
        return str(folder.resolve())
    return str(resolve_model_path(name))


def router_args_from(args: argparse.Namespace, environ) -> RouterArgs:
    """RouterArgs for the command's flags; ValueError naming the mistake."""
    if args.instance_api_key is not None and not args.instance_api_key:
        raise ValueError("--instance-api-key must not be empty")
    if args.discover_interval_s <= 0 or args.heartbeat_timeout_s <= 0:
        raise ValueError("--discover-interval and --heartbeat-timeout must be positive")
    if args.max_waiting_requests < 1 or args.shutdown_timeout_s < 0:
        raise ValueError("--max-waiting-requests must be at least 1 and --shutdown-timeout not negative")
    try:
        tokenizer = None if args.tokenizer is None else tokenizer_path(args.tokenizer)
    except (ValueError, OSError) as e:
        raise ValueError(f"--tokenizer: {e}") from None
    secret = resolve_secret(args.register_secret, environ, ROUTER_SECRET_ENV, "register secret")
    if not secret and not is_loopback(f"tcp://{args.host}:{args.port}"):
        raise ValueError(f"--host {args.host} is reachable from other machines, and anything listening beyond "
                         f"loopback authenticates its peers: set a register secret in {ROUTER_SECRET_ENV} (or "
                         f"--register-secret), the same for the router and every instance, e.g. "
                         f"`export {ROUTER_SECRET_ENV}=$(openssl rand -hex 32)`")
    return dataclasses.replace(
        options_from(RouterArgs, ROUTER_KNOBS, args),
        **{role: [http_base_url(url, f"--{role}") for url in getattr(args, role)]
           for role in ("instances", "prefill", "decode")},
        api_key=resolve_api_key(args.api_key, environ),
        instance_api_key=args.instance_api_key or environ.get(INSTANCE_API_KEY_ENV) or None, register_secret=secret,
        tokenizer=tokenizer)


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
    async with InstanceClients(timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=None, pool=None), trust_env=False,
                               limits=httpx.Limits(max_connections=None, max_keepalive_connections=64)) as clients:
        metrics = RouterMetrics(registry)
        picker = InstancePicker(RoutingPolicy(mode=a.routing_policy))
        streams, hashes = None, chunk_hashes_of
        if a.tokenizer is not None and picker.uses_prefixes:
            streams = KVEventStreams(registry, clients, picker, a.instance_api_key)
            hashes = TokenizedPrompts(a.tokenizer, streams.hashing_block_size).hashes
            metrics.follow(streams)
        proxy = UpstreamProxy(registry, picker, clients, metrics, shutdown, a.instance_api_key, prompt_hashes=hashes)
        app = build_router_app(registry, proxy, metrics, gate, a.api_key, a.register_secret or None)
        monitor = asyncio.create_task(InstanceMonitor(registry, clients, a.dns_targets, a.discover_interval_s,
                                                      picker=picker).run())
        following = asyncio.create_task(streams.run()) if streams is not None else None
        server = QuietSignalServer(http_config(app, a.host, a.port))
        serving = await start_serving(server)
        try:
            if not server.started:
                return 1
            print(f"tinyvllm router ready: routing at http://{a.host}:{a.port} ({len(a.instances) + len(a.prefill) + len(a.decode)} static instances"
                  f"{', discovering ' + ', '.join(name for name, _ in a.dns_targets.values()) if a.dns_targets else ''})",
                  flush=True)
            await serve_until_drained(server, serving, gate, a.shutdown_timeout_s, shutdown.fail_open, log)
            return 0
        finally:
            background = [task for task in (monitor, following) if task is not None]
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
