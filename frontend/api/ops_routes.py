"""Routes for operators rather than clients: /health, /metrics, /version and /openapi.json."""
import importlib.metadata

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinyvllm.frontend.api import openapi
from tinyvllm.frontend.api.openai_responses import OpenAPIDocument, VersionResponse


def package_version() -> str:
    try:
        return importlib.metadata.version("tinyvllm")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+unknown"


async def version(request: Request) -> Response:
    return JSONResponse({"version": package_version()})


async def openapi_document(request: Request) -> Response:
    # Built per request from the live route list, so routes mounted after build_app are described too.
    doc = openapi.build_document(request.app.routes, title="tinyvllm", version=package_version(),
                                 api_key_required=getattr(request.app.state, "api_key_required", False))
    return JSONResponse(doc)


def ops_routes(engine, metrics) -> list[Route]:
    async def health(request: Request) -> Response:
        return Response(status_code=503 if engine.dead_reason is not None else 200)

    async def prometheus(request: Request) -> Response:
        content, content_type = metrics.render()
        return Response(content, headers={"Content-Type": content_type})

    return [Route("/health", health, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
            Route("/version", version, methods=["GET"]),
            Route("/openapi.json", openapi_document, methods=["GET"])]


openapi.describe("/health", "GET", summary="200 while an engine serves, 503 while none can (all restarting)",
                 error_statuses=(503,), response_media_type=None)
openapi.describe("/metrics", "GET", summary="Prometheus metrics under vLLM's names", error_statuses=(),
                 response_media_type="text/plain")
openapi.describe("/version", "GET", response_schema=VersionResponse, summary="The server's version", error_statuses=())
openapi.describe("/openapi.json", "GET", response_schema=OpenAPIDocument, summary="This document", error_statuses=())
