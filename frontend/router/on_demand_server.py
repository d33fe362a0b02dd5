"""`tinyvllm serve --models-dir DIR` without --model: serves every model in the store, each loaded on demand
(frontend/router/model_servers.py, model_switch.py). SIGTERM or Ctrl-C drains as `tinyvllm serve` does, then stops
every model's server."""
import logging
import os
import signal

import uvloop

from tinyvllm.frontend.api.http_json import DEFAULT_MAX_BODY_BYTES
from tinyvllm.frontend.api.ollama.model_store import ModelStore
from tinyvllm.frontend.api.request_gate import RequestGate
from tinyvllm.frontend.api.server_options import ServerArgs
from tinyvllm.frontend.api.uvicorn_runner import QuietSignalServer, http_config, serve_until_drained, start_serving
from tinyvllm.frontend.engine.replica_router import LEAST_LOADED, RoutingPolicy
from tinyvllm.frontend.router.instance_picker import InstancePicker
from tinyvllm.frontend.router.instance_registry import InstanceRegistry
from tinyvllm.frontend.router.model_servers import ModelServers
from tinyvllm.frontend.router.model_switch import ServerClients, build_switch_app
from tinyvllm.frontend.router.router_metrics import RouterMetrics
from tinyvllm.frontend.router.upstream_proxy import Shutdown, UpstreamProxy
from tinyvllm.protocol.engine_config import EngineConfig

log = logging.getLogger("tinyvllm.frontend")


def default_max_loaded(environ=os.environ) -> int:
    """0 (as many as the free memory holds) on a CPU; 3 on another device (Ollama's default per GPU), whose memory
    MemAvailable does not tell."""
    return 0 if environ.get("DEV", "CPU").upper().startswith("CPU") else 3


def check_on_demand(engine: EngineConfig, args: ServerArgs) -> None:
    """What each model's own engine cannot share with the others', and what names one model."""
    if args.served_model_name is not None:
        raise ValueError("--served-model-name needs --model: models served on demand go by their stored names")
    if engine.parallel.external_workers:
        raise ValueError("--external-workers needs --model: models served on demand start their own workers")
    if engine.parallel.transport != "ipc":
        raise ValueError("models served on demand (--models-dir without --model) talk over ipc; their tcp ports "
                         "would collide")
    if engine.kv_transfer.role != "both":
        raise ValueError("--role needs --model: a prefill or decode instance serves one model")
    if engine.lora.enable_lora or args.lora_modules:
        raise ValueError("--enable-lora and --lora-modules need --model: an adapter fits one model's shapes")
    if engine.cache.kv_events_config is not None or engine.cache.kv_cache_dir or args.registration is not None:
        raise ValueError("--kv-events-config, --kv-cache-dir and --register-with need --model: the models served on "
                         "demand would share their ports, files and name")


async def serve_on_demand(engine: EngineConfig, args: ServerArgs, keep_alive_s: float) -> int:
    store = ModelStore(args.models_dir, None, None, 0)
    servers = ModelServers(store, engine, args, keep_alive_s, args.max_loaded_models or default_max_loaded())
    gate, shutdown, registry = RequestGate(args.max_waiting_requests, args.request_timeout_s), Shutdown(), \
        InstanceRegistry()
    proxy = UpstreamProxy(registry, InstancePicker(RoutingPolicy(mode=LEAST_LOADED)), ServerClients(servers),
                          RouterMetrics(registry), shutdown)
    app = build_switch_app(servers, proxy, gate, DEFAULT_MAX_BODY_BYTES, args.api_key, args.allowed_origins or None)
    server = QuietSignalServer(http_config(app, args.host, args.port))
    serving = await start_serving(server)
    try:
        if not server.started:
            return 1
        print(f"tinyvllm ready: serving the models in {store.folder} on demand at http://{args.host}:{args.port}/v1 "
              f"({len(store.list())} models; keep_alive {keep_alive_s:g} s, "
              f"{servers.max_loaded or 'as many as memory holds'} loaded at most"
              f"{', API key required' if args.api_key else ''})", flush=True)
        await serve_until_drained(server, serving, gate, args.shutdown_timeout_s, shutdown.fail_open, log)
        return 0
    finally:
        try:
            await servers.close()
        finally:
            servers.kill_all()  # (a no-op once close has stopped them)


def serve_models_on_demand(engine: EngineConfig, args: ServerArgs) -> None:
    """Serves until stopped; raises ValueError for flags that cannot go together."""
    args.validate()
    check_on_demand(engine, args)
    keep_alive_s = args.keep_alive_s(os.environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s frontend %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))  # until serving starts
    try:
        exit_code = uvloop.run(serve_on_demand(engine, args, keep_alive_s))
    except KeyboardInterrupt:
        exit_code = 0
    if exit_code:
        raise SystemExit(exit_code)
