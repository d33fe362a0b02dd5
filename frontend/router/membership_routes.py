"""/instances: instances register and leave, operators look and drain. With a register secret every route here needs
it as a bearer token (frontend/api/auth.py's middleware, on /instances).

- GET /instances: every known instance (url, role, source, state, load, draining, open requests, last seen).
- POST /instances/heartbeat {url, role, model, running, waiting, kv_usage, draining}: registers or refreshes the
  instance; 409 if an operator drained it (it is not let back in while it keeps beating).
- POST /instances/deregister {url}: the instance leaves (its own drain is over); requests open on it finish.
- POST /instances/drain {url}: no new requests go to it; it leaves the list once the router's open requests on it
  have finished, none of them cut.
"""
from typing import Annotated, Literal

from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api.http_json import error_response, read_json_object
from tinyvllm.frontend.api.request_models import RequestInvalid, RequestModel, validate
from tinyvllm.frontend.router.instance_registry import InstanceRegistry, Load
from tinyvllm.frontend.api.router_registration import http_base_url

MAX_BODY_BYTES = 64 * 1024


class InstanceURL(RequestModel):
    url: str

    @field_validator("url")
    @classmethod
    def _base_url(cls, url: str) -> str:
        return http_base_url(url, "url")


class Heartbeat(InstanceURL):
    role: Literal["both", "prefill", "decode"] = "both"
    model: str = ""
    running: Annotated[int, Field(ge=0)] = 0
    waiting: Annotated[int, Field(ge=0)] = 0
    kv_usage: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    draining: bool = False


async def _read(request: Request, model: type[InstanceURL]):
    body = await read_json_object(request, MAX_BODY_BYTES)
    try:
        return validate(model, body)
    except RequestInvalid as e:
        raise api.APIError(e.message, 400, param=e.param) from None


def membership_routes(registry: InstanceRegistry) -> list[Route]:
    def answers_errors(handler):
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except api.APIError as e:
                return error_response(e)
        return wrapped

    async def listing(request: Request) -> Response:
        return JSONResponse({"instances": [registry.describe(i) for i in registry.all()]})

    @answers_errors
    async def heartbeat(request: Request) -> Response:
        beat = await _read(request, Heartbeat)
        load = Load(beat.running, beat.waiting, beat.kv_usage, beat.draining)
        if not registry.heartbeat(beat.url, beat.role, beat.model, load):
            raise api.APIError(f"{beat.url} was drained from this router (or the router is full); it is not taken "
                               f"back while it keeps beating", 409, "ConflictError")
        return JSONResponse({"url": beat.url, "state": registry.state(registry.get(beat.url))})

    def leaving(by_operator: bool):
        @answers_errors
        async def handler(request: Request) -> Response:
            url = (await _read(request, InstanceURL)).url
            instance = registry.get(url)
            if instance is None or not registry.drain(url, by_operator=by_operator):
                raise api.APIError(f"no instance {url} is known here", 404, "NotFoundError", "url")
            return JSONResponse({"url": url, "open_requests": instance.open,
                                 "removed": registry.get(url) is not instance})
        return handler

    return [Route("/instances", listing, methods=["GET"]),
            Route("/instances/heartbeat", heartbeat, methods=["POST"]),
            Route("/instances/deregister", leaving(by_operator=False), methods=["POST"]),
            Route("/instances/drain", leaving(by_operator=True), methods=["POST"])]
