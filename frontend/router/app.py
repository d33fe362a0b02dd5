"""The router's HTTP app: /v1/*, /api/*, /rerank, /v2/rerank and /score proxied to the instances, /instances for
membership, /health, /metrics, /dashboard (every instance's, summed and side by side).

Middleware as in `tinyvllm serve` (frontend/api/app.py): the API key on /v1 and /api, the register secret on
/instances, then the request gate (--max-waiting-requests counts requests without any answer yet; the drain).
"""
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tinyvllm.frontend.api.auth import APIKeyMiddleware
from tinyvllm.frontend.api.request_gate import GateMiddleware, RequestGate
from tinyvllm.frontend.router.dashboard_routes import router_dashboard_routes
from tinyvllm.frontend.router.instance_registry import InstanceRegistry
from tinyvllm.frontend.router.membership_routes import membership_routes
from tinyvllm.frontend.router.router_metrics import RouterMetrics
from tinyvllm.frontend.router.upstream_proxy import UpstreamProxy

PROXIED_METHODS = ["GET", "POST", "DELETE", "HEAD"]
MEMBERSHIP_PREFIX = ("/instances",)


def build_router_app(registry: InstanceRegistry, proxy: UpstreamProxy, metrics: RouterMetrics, gate: RequestGate,
                     api_key: str | None = None, register_secret: str | None = None) -> Starlette:
    async def health(request: Request) -> Response:
        return Response(status_code=200 if registry.routable() else 503)

    async def prometheus(request: Request) -> Response:
        content, content_type = metrics.render()
        return Response(content, headers={"Content-Type": content_type})

    return Starlette(
        routes=[Route("/health", health, methods=["GET"]),
                Route("/metrics", prometheus, methods=["GET"]),
                *membership_routes(registry),
                *router_dashboard_routes(registry, proxy.clients, gate, api_key, proxy.instance_authorization),
                Route("/v1/{rest:path}", proxy, methods=PROXIED_METHODS),
                Route("/api/{rest:path}", proxy, methods=PROXIED_METHODS),
                *(Route(path, proxy, methods=["POST"]) for path in ("/rerank", "/v2/rerank", "/score"))],
        middleware=[*([Middleware(APIKeyMiddleware, api_key=api_key)] if api_key else []),
                    *([Middleware(APIKeyMiddleware, api_key=register_secret, prefixes=MEMBERSHIP_PREFIX)]
                      if register_secret else []),
                    Middleware(GateMiddleware, gate=gate)])
