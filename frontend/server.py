"""`tinyvllm serve`: the engine's processes behind an OpenAI-compatible HTTP server (uvicorn on uvloop)."""
import asyncio
import logging
import signal
from dataclasses import dataclass

import uvicorn
import uvloop

from tinyvllm.frontend.app import build_app
from tinyvllm.frontend.engine_client import EngineClient
from tinyvllm.frontend.launcher import EngineArgs, EngineProcesses
from tinyvllm.frontend.tokenizer import Tokenizer

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"


@dataclass(slots=True)
class ServerArgs:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    startup_timeout_s: float = 900.0
    api_key: str | None = None  # required on /v1 and /api when set
    models_dir: str | None = None  # Ollama's model store (manifests for /api/tags, /api/create, ...)


async def serve_async(procs: EngineProcesses, engine_args: EngineArgs, server_args: ServerArgs) -> None:
    name = server_args.served_model_name or (DEFAULT_SERVED_NAME if engine_args.model is None else
                                             procs.model_path.stem if procs.model_path.is_file() else procs.model_path.name)
    tokenizer = Tokenizer.from_model_path(procs.model_path)
    engine = EngineClient(procs.endpoints.scheduler_input, procs.endpoints.frontend_output)
    procs.start()
    try:
        ready = await engine.start(server_args.startup_timeout_s, procs.dead_process)
        app = build_app(engine, tokenizer, name, ready.max_model_len, model_root=str(procs.model_path),
                        api_key=server_args.api_key, models_dir=server_args.models_dir)
        config = uvicorn.Config(app, host=server_args.host, port=server_args.port, loop="none", log_level="warning",
                                timeout_graceful_shutdown=5, lifespan="off")
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started:
            print(f"tinyvllm ready: serving {name} at http://{server_args.host}:{server_args.port}/v1 "
                  f"({ready.num_blocks} KV blocks of {ready.block_size} tokens, max_model_len {ready.max_model_len}"
                  f"{', API key required' if server_args.api_key else ''})",
                  flush=True)
        await serving
    finally:
        await engine.close()


def serve(engine_args: EngineArgs, server_args: ServerArgs) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s frontend %(levelname)s %(message)s")

    def stop_on_sigterm(*_):  # SIGTERM stops like Ctrl-C: in the event loop, asyncio.Runner cancels the main task
        signal.raise_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    procs = EngineProcesses(engine_args)
    try:
        uvloop.run(serve_async(procs, engine_args, server_args))
    except KeyboardInterrupt:
        pass
    finally:
        procs.stop()
