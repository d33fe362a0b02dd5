"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter, vLLM's: adapters added and removed by name while the
server runs, only where VLLM_ALLOW_RUNTIME_LORA_UPDATING is true (as vLLM: otherwise the routes do not exist), since
a loaded path is read by the server. Bodies `{"lora_name", "lora_path"}` and `{"lora_name"}`; answers vLLM's texts."""
import asyncio
import os

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api.http_json import read_json_body
from tinyvllm.frontend.engine.lora_adapters import LoRAAdapters
from tinyvllm.protocol.lora_adapter import LoRAError

RUNTIME_UPDATES_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def runtime_updates_allowed(environ=os.environ) -> bool:
    return environ.get(RUNTIME_UPDATES_ENV, "").strip().lower() in ("1", "true")


def lora_routes(adapters: LoRAAdapters, max_body_bytes: int, environ=os.environ) -> list[Route]:
    if not runtime_updates_allowed(environ):
        return []

    async def fields(request: Request, *names: str) -> list[str]:
        body = await read_json_body(request, max_body_bytes)
        values = [body.get(name) if isinstance(body, dict) else None for name in names]
        if not all(isinstance(v, str) and v for v in values):
            raise api.APIError(f"{' and '.join(repr(n) for n in names)} must be provided.")
        return values

    async def load(request: Request) -> Response:
        try:
            name, path = await fields(request, "lora_name", "lora_path")
            adapters.check_name_free(name)
            adapter = adapters.named(name, path)
            await asyncio.to_thread(adapters.check, adapter)  # reads the folder off the event loop
            adapters.add(adapter)  # on the loop: two loads of one name cannot both succeed
        except api.APIError as e:
            return JSONResponse(e.body(), status_code=e.status)
        except LoRAError as e:
            error = api.APIError(str(e), 404, "NotFoundError") if e.not_found else api.APIError(str(e))
            return JSONResponse(error.body(), status_code=error.status)
        except ValueError as e:  # the name is taken
            return JSONResponse(api.APIError(str(e)).body(), status_code=400)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(request: Request) -> Response:
        try:
            name, = await fields(request, "lora_name")
        except api.APIError as e:
            return JSONResponse(e.body(), status_code=e.status)
        if not adapters.remove(name):
            error = api.APIError(f"The lora adapter '{name}' cannot be found.", 404, "NotFoundError")
            return JSONResponse(error.body(), status_code=404)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    return [Route("/v1/load_lora_adapter", load, methods=["POST"]),
            Route("/v1/unload_lora_adapter", unload, methods=["POST"])]
