"""`tinyvllm serve`: the engines' processes behind an OpenAI-compatible HTTP server (uvicorn on uvloop).

The engines restart themselves when they fail (frontend/engine_pool.py); if one gives up, the server stops and
exits with code 1, so that systemd or Kubernetes restarts it.
"""
import asyncio
import logging
import signal
from dataclasses import dataclass

import uvicorn
import uvloop

from tinyvllm.frontend.app import build_app
from tinyvllm.frontend.engine_pool import EnginePool, launch_pool
from tinyvllm.frontend.launcher import EngineArgs
from tinyvllm.frontend.tokenizer import Tokenizer

log = logging.getLogger("tinyvllm.frontend")

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"


@dataclass(slots=True)
class ServerArgs:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    startup_timeout_s: float = 900.0
    api_key: str | None = None  # required on /v1 and /api when set
    models_dir: str | None = None  # Ollama's model store (manifests for /api/tags, /api/create, ...)


async def serve_async(engine: EnginePool, engine_args: EngineArgs, server_args: ServerArgs) -> int:
    """Serves until stopped (0) or until an engine gives up restarting (1)."""
    model_path = engine.model_path
    name = server_args.served_model_name or (DEFAULT_SERVED_NAME if engine_args.model is None else
                                             model_path.stem if model_path.is_file() else model_path.name)
    tokenizer = Tokenizer.from_model_path(model_path)
    try:
        ready = await engine.start(server_args.startup_timeout_s)
        app = build_app(engine, tokenizer, name, ready.max_model_len, model_root=str(model_path),
                        api_key=server_args.api_key, models_dir=server_args.models_dir)
        config = uvicorn.Config(app, host=server_args.host, port=server_args.port, loop="none", log_level="warning",
                                timeout_graceful_shutdown=5, lifespan="off")
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started:
            engines = f"{len(engine.replicas)} engines of " if len(engine.replicas) > 1 else ""
            print(f"tinyvllm ready: serving {name} at http://{server_args.host}:{server_args.port}/v1 "
                  f"({engines}{ready.num_blocks} KV blocks of {ready.block_size} tokens, "
                  f"max_model_len {ready.max_model_len}{', API key required' if server_args.api_key else ''})",
                  flush=True)
        given_up = asyncio.create_task(engine.wait_until_given_up())
        await asyncio.wait((serving, given_up), return_when=asyncio.FIRST_COMPLETED)
        if not given_up.done():
            given_up.cancel()
            await serving
            return 0
        log.error("stopping the server: %s", given_up.result())
        server.should_exit = True
        await serving
        return 1
    finally:
        await engine.close()


def serve(engine_args: EngineArgs, server_args: ServerArgs) -> None:
    """Serves until stopped; raises SystemExit(1) once an engine could not be restarted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s frontend %(levelname)s %(message)s")

    def stop_on_sigterm(*_):  # SIGTERM stops like Ctrl-C: in the event loop, asyncio.Runner cancels the main task
        signal.raise_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    engine = launch_pool(engine_args)
    try:
        exit_code = uvloop.run(serve_async(engine, engine_args, server_args))
    except KeyboardInterrupt:
        exit_code = 0
    finally:
        engine.stop_processes()
    if exit_code:
        raise SystemExit(exit_code)
