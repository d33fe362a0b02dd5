"""/dashboard: one HTML page (dashboard.html, shipped in the package) that shows the engines live, fed by
/dashboard/events (server-sent events, a JSON snapshot about once a second); /dashboard/snapshot answers one.

With --api-key, these routes need the key too. A browser's EventSource cannot send an Authorization header, so for
/dashboard only the key is also taken as the `key` query parameter: opening /dashboard?key=<key> answers the page
with a cookie (HttpOnly, SameSite=Strict, path /dashboard) that the page's event stream then carries. The cookie holds
an HMAC of the key, never the key. Open event streams are bounded (MAX_EVENT_STREAMS; 503 past it).
"""
import asyncio
import hmac
import importlib.resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from tinyvllm.frontend.api import openapi
from tinyvllm.frontend.api.auth import KeyCheck
from tinyvllm.frontend.api.dashboard_snapshot import SAMPLE_INTERVAL_S, DashboardHistory, snapshot
from tinyvllm.frontend.api.openai_protocol import error_body
from tinyvllm.frontend.api.streaming import StreamSlots, sse_event

MAX_EVENT_STREAMS = 8
KEY_PARAM = "key"
COOKIE_NAME = "tinyvllm_dashboard"
COOKIE_PATH = "/dashboard"


def dashboard_html() -> str:
    return importlib.resources.files("tinyvllm.frontend.api").joinpath("dashboard.html").read_text(encoding="utf-8")


class DashboardAccess:
    """Who may see the dashboard: anyone without an API key; with one, a request carrying it as a Bearer header, the
    `key` query parameter, or the cookie that the page was answered with (an HMAC of the key, never the key)."""

    def __init__(self, api_key: str | None):
        self.required = bool(api_key)
        self.key = KeyCheck(api_key or "")
        self.cookie_value = hmac.new((api_key or "").encode("utf-8"), b"tinyvllm dashboard", "sha256").hexdigest()
        self._cookie = KeyCheck(self.cookie_value)

    def allows(self, request: Request) -> bool:
        if not self.required or self.key.bearer_matches(request.headers):
            return True
        if (key := request.query_params.get(KEY_PARAM)) is not None and self.key.matches(key.encode("utf-8")):
            return True
        # any text a client sends, as bytes: compare_digest refuses non-ASCII str
        return self._cookie.matches(request.cookies.get(COOKIE_NAME, "").encode("utf-8", "surrogateescape"))


def unauthorized() -> Response:
    return JSONResponse(error_body(f"Unauthorized: open /dashboard?{KEY_PARAM}=<api key>", "AuthenticationError", 401),
                        status_code=401, headers={"WWW-Authenticate": "Bearer"})


def dashboard_routes(engine, metrics, gate, model_name: str, api_key: str | None) -> list[Route]:
    """`tinyvllm serve`'s dashboard: its engines (frontend/api/dashboard_snapshot.py)."""
    history = DashboardHistory(metrics)

    async def make_snapshot() -> dict:
        return snapshot(engine, history, model_name)
    return page_routes(make_snapshot, gate, api_key)


def page_routes(make_snapshot, gate, api_key: str | None) -> list[Route]:
    """The page, one snapshot and the event stream, for any `async make_snapshot() -> dict` of the page's shape (the
    server's engines, or the router's instances: frontend/router/dashboard_routes.py)."""
    access, page = DashboardAccess(api_key), dashboard_html()
    slots = StreamSlots(MAX_EVENT_STREAMS, f"At most {MAX_EVENT_STREAMS} dashboards may watch at once")

    async def dashboard(request: Request) -> Response:
        if not access.allows(request):
            return unauthorized()
        response = HTMLResponse(page, headers={"Cache-Control": "no-store"})
        if access.required:
            response.set_cookie(COOKIE_NAME, access.cookie_value, path=COOKIE_PATH, httponly=True, samesite="strict")
        return response

    async def current(request: Request) -> Response:
        if not access.allows(request):
            return unauthorized()
        return JSONResponse(await make_snapshot())

    async def snapshots():
        while not gate.draining:  # a stream would otherwise hold the server's graceful shutdown open
            yield sse_event(await make_snapshot())
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def events(request: Request) -> Response:
        if not access.allows(request):
            return unauthorized()
        return slots.stream(lambda: (snapshots(), lambda: None))

    return [Route("/dashboard", dashboard, methods=["GET"]),
            Route("/dashboard/snapshot", current, methods=["GET"]),
            # Left out of /openapi.json: it never ends, so a generic client (or schemathesis) would wait forever.
            Route("/dashboard/events", events, methods=["GET"], include_in_schema=False)]


openapi.describe("/dashboard", "GET", summary="A live HTML view of the engines (fed by /dashboard/events, "
                 "server-sent events); with --api-key, open it as /dashboard?key=<key>", error_statuses=(401,),
                 response_media_type="text/html")
openapi.describe("/dashboard/snapshot", "GET", response_schema={"type": "object"}, error_statuses=(401,),
                 summary="What /dashboard shows, as JSON: running, waiting, KV blocks, batch, history, replicas")
