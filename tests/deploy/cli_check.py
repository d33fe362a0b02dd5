"""A container's `tinyvllm` command line, parsed by tinyvllm's own parser (tinyvllm.frontend.cli.main.build_parser),
so a renamed or removed flag fails the manifests' tests; and the HTTP routes a probe or a scrape may name."""
import argparse
import asyncio
import sys

from tests.deploy.kube import REPO
from tinyvllm.frontend.cli.main import build_parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def parse(argv: list[str]) -> argparse.Namespace:
    """argv (without the program name) as `tinyvllm` parses it; AssertionError when it refuses it."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        raise AssertionError(f"tinyvllm refuses {argv} (its error is above)") from None


def serve_get(paths: set[str]) -> dict[str, tuple[int, str]]:
    """(status, body) of GET path on the real app (tinyvllm.frontend.api.app.build_app on tests/frontend's fake
    engine)."""
    import httpx
    sys.path.insert(0, str(REPO / "tests" / "frontend"))
    try:
        from app_harness import make_app
    finally:
        sys.path.remove(str(REPO / "tests" / "frontend"))
    app, _, _ = make_app()

    async def get_all():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://pod") as client:
            return {path: ((r := await client.get(path)).status_code, r.text) for path in paths}
    return asyncio.run(get_all())


def router_routes() -> set[str]:
    """The paths `tinyvllm router`'s app serves itself (not proxied)."""
    from tinyvllm.frontend.router.app import build_router_app
    from tinyvllm.frontend.api.request_gate import RequestGate

    class Proxy:  # only its routes are read: never called
        clients = instance_authorization = None

        async def __call__(self, scope, receive, send):
            raise AssertionError("not served")
    app = build_router_app(None, Proxy(), None, RequestGate())
    return {route.path for route in app.routes}
