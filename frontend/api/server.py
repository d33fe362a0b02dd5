"""`tinyvllm serve`: the engines' processes behind an OpenAI-compatible HTTP server (uvicorn on uvloop).

The engines restart themselves when they fail (frontend/engine/engine_pool.py); if one gives up, the server stops and
exits with code 1, so that systemd or Kubernetes restarts it. SIGTERM or Ctrl-C drains (frontend/api/request_gate.py):
new requests get 503, open ones get up to --shutdown-timeout to finish, the rest end with an error, then the server
and its processes stop and it exits 0; a second signal cuts the wait short. With --register-with it heartbeats to a
`tinyvllm router` and leaves it once drained (frontend/api/router_registration.py).
"""
import asyncio
import logging
import signal
import sys

import uvloop

from tinyvllm.frontend.api.app import build_app
from tinyvllm.frontend.engine.engine_pool import EnginePool, launch_pool
from tinyvllm.frontend.engine.lora_adapters import LoRAAdapters
from tinyvllm.frontend.api.ollama.model_store import default_models_dir
from tinyvllm.frontend.api.request_gate import RequestGate
from tinyvllm.frontend.api.router_registration import RouterHeartbeat
from tinyvllm.frontend.api.server_options import ServerArgs
from tinyvllm.protocol.gguf_file import forget_parsed_headers
from tinyvllm.protocol.tokenizer import Tokenizer
from tinyvllm.frontend.api.uvicorn_runner import QuietSignalServer, drain_on_signals, http_config, start_serving
from tinyvllm.protocol.child_process import child_args
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.process_guard import exit_with_parent

log = logging.getLogger("tinyvllm.frontend")

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"


async def serve_async(engine: EnginePool, engine_config: EngineConfig, server_args: ServerArgs) -> int:
    """Serves until stopped (0) or until an engine gives up restarting (1)."""
    model_path = engine.model_path
    name = server_args.served_model_name or (DEFAULT_SERVED_NAME if engine_config.model.model is None else
                                             model_path.stem if model_path.is_file() else model_path.name)
    tokenizer = Tokenizer.from_model_path(model_path)
    forget_parsed_headers()  # the tokenizer holds the vocabulary now
    gate = RequestGate(server_args.max_waiting_requests, server_args.request_timeout_s)
    adapters = LoRAAdapters(model_path, engine_config.lora, name)
    adapters.add_modules(server_args.lora_modules)  # before the engine starts: a wrong adapter stops the server
    heartbeat: RouterHeartbeat | None = None
    try:
        ready = await engine.start(server_args.startup_timeout_s)
        app = build_app(engine, tokenizer, name, ready.max_model_len, model_root=str(model_path),
                        api_key=server_args.api_key, models_dir=server_args.models_dir or str(default_models_dir()),
                        gate=gate,
                        allowed_origins=server_args.allowed_origins or None,
                        default_max_tokens=server_args.default_max_tokens,
                        reasoning_parser=server_args.reasoning_parser,
                        responses_store_size=server_args.responses_store_size,
                        adapters=adapters if engine_config.lora.enable_lora else None)
        config = http_config(app, server_args.host, server_args.port, server_args.uds)
        server = QuietSignalServer(config)
        serving = await start_serving(server)
        if server.started:
            engines = f"{len(engine.replicas)} engines of " if len(engine.replicas) > 1 else ""
            address = f"unix:{server_args.uds}" if server_args.uds else \
                f"http://{server_args.host}:{server_args.port}/v1"
            print(f"tinyvllm ready: serving {name} at {address} "
                  f"({engines}{ready.num_blocks} KV blocks of {ready.block_size} tokens in {ready.kv_cache_dtype}, "
                  f"max_model_len {ready.max_model_len}{', API key required' if server_args.api_key else ''})",
                  flush=True)
        given_up = asyncio.create_task(engine.wait_until_given_up())
        stop_asked = asyncio.Event()
        drain_on_signals(stop_asked, gate, server)
        if server_args.registration is not None and server.started:
            heartbeat = RouterHeartbeat(server_args.registration, name, lambda: engine.stats,
                                        lambda: engine.dead_reason is None, stop_asked.is_set,
                                        role=engine_config.kv_transfer.role)
            heartbeat.start()
        stopping = asyncio.create_task(stop_asked.wait())
        await asyncio.wait((serving, given_up, stopping), return_when=asyncio.FIRST_COMPLETED)
        if heartbeat is not None:
            heartbeat.wake()  # tells the router at once that this server drains or stops
        if given_up.done():
            log.error("stopping the server: %s", given_up.result())
            exit_code = 1
        else:
            given_up.cancel()
            exit_code = 0
            if stopping.done():
                log.info("draining: %d requests open; new ones get 503 (up to %g s)", gate.open,
                         server_args.shutdown_timeout_s)
                await engine.stop_restarting()  # an engine that fails now is not started again
                if left := await gate.drain(server_args.shutdown_timeout_s, engine.fail_open_requests):
                    log.warning("%d requests did not finish within --shutdown-timeout and ended with an error", left)
                config.timeout_graceful_shutdown = 2  # what is left is not generation (an upload, say)
        stopping.cancel()
        if heartbeat is not None:  # after the drain (the router's requests here are done), before the port closes
            await heartbeat.leave()
            heartbeat = None
        server.should_exit = True
        await serving
        return exit_code
    finally:
        if heartbeat is not None:
            await heartbeat.leave()
        await engine.close()


def serve(engine_config: EngineConfig, server_args: ServerArgs) -> None:
    """Serves until stopped; raises SystemExit(1) once an engine could not be restarted."""
    server_args.validate()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s frontend %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per heartbeat to a router

    def stop_on_sigterm(*_):  # until serving starts, SIGTERM stops like Ctrl-C: asyncio.Runner cancels the main task
        signal.raise_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    engine = launch_pool(engine_config)
    try:
        exit_code = uvloop.run(serve_async(engine, engine_config, server_args))
    except KeyboardInterrupt:
        exit_code = 0
    finally:
        engine.stop_processes()
    if exit_code:
        raise SystemExit(exit_code)


def main(argv: list[str]) -> None:
    """`python -m tinyvllm.frontend.api.server '<json [EngineConfig, ServerArgs]>'`: one model's server under
    `tinyvllm serve --models-dir` (frontend/router/model_servers.py), which ends with its parent."""
    engine_config, server_args = child_args(argv, EngineConfig, ServerArgs)
    exit_with_parent(handle_signals=False)
    serve(engine_config, server_args)


if __name__ == "__main__":
    main(sys.argv)
