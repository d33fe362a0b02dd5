"""The HTTP side of `tinyvllm serve --models-dir` without --model: every stored model served on demand.

Requests that name a model (OpenAI, Anthropic, Ollama, rerank, tokenize) go to that model's own server
(frontend/router/model_servers.py), started first if it is not running, through the router's proxy
(frontend/router/upstream_proxy.py: streams pass through, a client that leaves aborts). The store's routes (/api/tags,
/api/show, /api/create, ...) are answered here, with no engine. What is loaded shows in /api/ps, GET /models and
/v1/models (each model's `status`, as llama.cpp's router mode), and POST /models/load and /models/unload change it.
/metrics is every loaded model's, each series labelled with its model_name, as vLLM's.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tinyvllm.frontend.api.auth import OLLAMA, PROTECTED_PREFIXES, APIKeyMiddleware, error_body_for, error_style
from tinyvllm.frontend.api.http_json import read_bounded_body, read_json_object
from tinyvllm.frontend.api.ollama import names
from tinyvllm.frontend.api.ollama.generation import load_reply
from tinyvllm.frontend.api.ollama.keep_alive import KeepAliveInvalid, is_unload, keep_alive_seconds
from tinyvllm.frontend.api.ollama.model_routes import NEVER_EXPIRES, tag_entry
from tinyvllm.frontend.api.ollama.model_store import StoreError, now_rfc3339
from tinyvllm.frontend.api.ollama.routes import store_routes
from tinyvllm.frontend.api.ollama.service import OllamaService
from tinyvllm.frontend.api.openai_protocol import APIError
from tinyvllm.frontend.api.request_gate import GateMiddleware, RequestGate, current_ticket, send_error
from tinyvllm.frontend.router.model_servers import LOADED, ModelLoadError, ModelServer, ModelServers
from tinyvllm.frontend.router.router_metrics import MergedFamilies
from tinyvllm.frontend.router.upstream_proxy import UpstreamProxy

# POST routes whose body names the model that answers
MODEL_ROUTES = ("/v1/{rest:path}", "/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/api/rerank",
                "/rerank", "/v2/rerank", "/score", "/tokenize", "/detokenize")
# with --api-key every route but /health, /metrics and / needs it: any other may start a model or name its files
PROTECTED = (*PROTECTED_PREFIXES, "/models", "/tokenize", "/detokenize")
_LOAD_ONLY = {"/api/generate": "prompt", "/api/chat": "messages"}  # Ollama's (un)load: no prompt, no messages


class _RequestRefused(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.type_ = status, type_


class ServerClients:
    """The proxy's view of the models' HTTP clients (frontend/router/instance_clients.py's `using`)."""

    def __init__(self, servers: ModelServers):
        self.servers = servers

    @contextlib.contextmanager
    def using(self, url: str):
        if (server := self.servers.by_url.get(url)) is None:
            raise httpx.ConnectError(f"the model's server at {url} stopped")
        yield server.client


class ModelSwitch:
    """The ASGI app behind MODEL_ROUTES: reads the body, starts or finds the model's server, forwards."""

    def __init__(self, servers: ModelServers, proxy: UpstreamProxy, max_body_bytes: int):
        self.servers, self.proxy, self.max_body_bytes = servers, proxy, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        try:
            body = await read_bounded_body(Request(scope, receive), self.max_body_bytes,
                                           _RequestRefused(413, f"The request body is larger than "
                                                                f"{self.max_body_bytes} bytes",
                                                           "RequestEntityTooLargeError"))
            request, name, keep_alive_s = self._parse(path, body)
            served_name = self.servers.served_name(name)
            if request.get("model") != served_name:  # the model's server knows only its own spelling of the name
                request["model"] = served_name
                request.pop("name", None)
                body = json.dumps(request).encode()
            if path in _LOAD_ONLY and not request.get(_LOAD_ONLY[path]) and is_unload(request.get("keep_alive")) \
                    and not self.servers.is_loaded(name):
                await load_reply(name, path == "/api/chat", unload=True)(scope, receive, send)
                return
            ticket = current_ticket()
            try:  # the wait for the model (its load, or room for it) is bounded by the request's deadline
                async with asyncio.timeout_at(ticket.deadline if ticket is not None else None):
                    server = await self.servers.acquire(name, self.servers.keep_alive_s if keep_alive_s is None
                                                        else keep_alive_s)
            except TimeoutError:
                raise _RequestRefused(504, f"model '{name}' was not ready within the request's time limit "
                                           "(--request-timeout)", "GatewayTimeoutError") from None
            try:
                await self.proxy.forward(scope, body, receive, send, [server.instance])
            finally:
                self.servers.release(server)
        except ClientDisconnect:
            return
        except _RequestRefused as e:
            await send_error(send, path, e.status, str(e), e.type_)
        except StoreError as e:
            await send_error(send, path, e.status, _not_found(path, name) if e.status == 404 else str(e),
                             "NotFoundError" if e.status == 404 else "BadRequestError")
        except ModelLoadError as e:
            await send_error(send, path, 500, str(e), "InternalServerError")

    @staticmethod
    def _parse(path: str, body: bytes) -> tuple[dict, str, float | None]:
        """The request, the model it names and its keep_alive in seconds (None: the server's default)."""
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise _RequestRefused(400, "The request body is not valid JSON") from None
        if not isinstance(request, dict):
            raise _RequestRefused(400, "The request body must be a JSON object")
        name = request.get("model") or request.get("name")
        if not isinstance(name, str) or not name.strip():
            raise _RequestRefused(400, "model is required" if error_style(path) == OLLAMA else
                                  "you must provide a model parameter")
        keep_alive = request.get("keep_alive")
        try:
            return request, name, None if keep_alive is None else keep_alive_seconds(keep_alive)
        except KeepAliveInvalid as e:
            raise _RequestRefused(400, str(e)) from None


def _not_found(path: str, name: str) -> str:
    return f'model "{name}" not found, try pulling it first' if error_style(path) == OLLAMA else \
        f"The model `{name}` does not exist."


def _rfc3339_in(seconds: float) -> str:
    return NEVER_EXPIRES if math.isinf(seconds) else now_rfc3339(time.time() + seconds)


def build_switch_app(servers: ModelServers, proxy: UpstreamProxy, gate: RequestGate, max_body_bytes: int,
                     api_key: str | None = None, allowed_origins: list[str] | None = None) -> Starlette:
    store, started_at = servers.store, int(time.time())
    switch = ModelSwitch(servers, proxy, max_body_bytes)

    def expires_at(server: ModelServer) -> str:
        """When its keep_alive runs out: from its last request's end, or (busy, loading) as if that were now."""
        at = server.expires_at
        return _rfc3339_in(server.keep_alive_s if at is None else at - servers.clock())

    async def from_each(path: str) -> list[tuple[ModelServer, Response | None]]:
        async def get(server: ModelServer):
            with contextlib.suppress(Exception):
                reply = await server.client.get(f"http://model{path}", timeout=5.0)
                if reply.status_code == 200:
                    return server, reply
            return server, None
        return await asyncio.gather(*(get(s) for s in list(servers.servers.values()) if s.state == LOADED))

    async def ps(request: Request) -> Response:
        running = {s.name: reply.json()["models"][0] for s, reply in await from_each("/api/ps") if reply is not None}
        models = []
        for server in list(servers.servers.values()):
            entry = running.get(server.name) or {**tag_entry(server.entry), "size_vram": server.entry.size}
            entry.pop("modified_at", None)
            models.append({**entry, "name": server.entry.name, "model": server.entry.name,
                           "expires_at": expires_at(server), "status": server.state})
        return JSONResponse({"models": models})

    def status(name: str) -> str:
        server = servers.servers.get(name)
        return "unloaded" if server is None else server.state

    async def models(request: Request) -> Response:
        entries = await asyncio.to_thread(store.list)
        cards = [{"id": names.short_name(e.name), "object": "model", "owned_by": "tinyvllm", "created": started_at,
                  "root": e.source, "parent": None, "status": {"value": status(names.key(e.name))}}
                 for e in entries]
        return JSONResponse({"object": "list", "data": cards})

    async def change(request: Request, load: bool) -> Response:
        try:
            name = (await read_json_object(request, max_body_bytes)).get("model")
            if not isinstance(name, str) or not name:
                raise _RequestRefused(400, "you must provide a model parameter")
            if load:
                await servers.load(name)
            elif not servers.unload(name):
                raise _RequestRefused(400, f"model '{name}' is not loaded")
            return JSONResponse({"success": True})
        except APIError as e:  # a body too large, not JSON, or no object
            error = _RequestRefused(e.status, e.message, e.type)
        except _RequestRefused as e:
            error = e
        except StoreError as e:
            error = _RequestRefused(e.status, _not_found(request.url.path, name) if e.status == 404 else str(e),
                                    "NotFoundError" if e.status == 404 else "BadRequestError")
        except ModelLoadError as e:
            error = _RequestRefused(500, str(e), "InternalServerError")
        return JSONResponse(error_body_for(request.url.path, str(error), error.status, error.type_),
                            status_code=error.status)

    async def load(request: Request) -> Response:
        return await change(request, load=True)

    async def unload(request: Request) -> Response:
        return await change(request, load=False)

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        registry = CollectorRegistry()
        registry.register(MergedFamilies([reply.text for _, reply in await from_each("/metrics") if reply]))
        return Response(generate_latest(registry) + proxy.metrics.render()[0],
                        headers={"Content-Type": CONTENT_TYPE_LATEST})

    return Starlette(
        routes=[Route("/health", health, methods=["GET"]),
                Route("/metrics", metrics, methods=["GET"]),
                Route("/api/ps", ps, methods=["GET"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/models", models, methods=["GET"]),
                Route("/models/load", load, methods=["POST"]),
                Route("/models/unload", unload, methods=["POST"]),
                *store_routes(OllamaService.store_only(store, max_body_bytes)),
                *(Route(path, switch, methods=["POST"]) for path in MODEL_ROUTES)],
        middleware=[*([Middleware(CORSMiddleware, allow_origins=allowed_origins, allow_methods=["*"],
                                  allow_headers=["*"])] if allowed_origins else []),
                    *([Middleware(APIKeyMiddleware, api_key=api_key, prefixes=PROTECTED)] if api_key else []),
                    Middleware(GateMiddleware, gate=gate, max_body_bytes=max_body_bytes)])
