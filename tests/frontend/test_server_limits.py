"""The limit flags of `tinyvllm serve` reach the server and are checked, and --allowed-origins turns CORS on."""
import pytest

from app_harness import MODEL, client_for, make_app
from tinyvllm.frontend.cli import main as cli
from tinyvllm.frontend.api.app import build_app
from tinyvllm.frontend.api.server import ServerArgs


def test_the_limit_flags_reach_the_server(serve_calls):
    assert cli.main(["serve"]) == 0
    assert cli.main(["serve", "--max-waiting-requests", "8", "--request-timeout", "60", "--shutdown-timeout", "5",
                     "--allowed-origins", "http://localhost:3000, https://chat.example"]) == 0
    limits = [(s.max_waiting_requests, s.request_timeout_s, s.shutdown_timeout_s, s.allowed_origins)
              for _, s in serve_calls]
    assert limits == [(512, None, 30.0, []), (8, 60.0, 5.0, ["http://localhost:3000", "https://chat.example"])]


@pytest.mark.parametrize("args, message", [
    (dict(max_waiting_requests=0), "--max-waiting-requests must be at least 1"),
    (dict(request_timeout_s=0), "--request-timeout must be positive"),
    (dict(shutdown_timeout_s=-1), "--shutdown-timeout must not be negative")])
def test_bad_limits_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        ServerArgs(**args).validate()


@pytest.mark.anyio
@pytest.mark.parametrize("origins, allowed", [(["http://localhost:3000"], "http://localhost:3000"), (["*"], "*"),
                                              (None, None)])
async def test_cors_answers_browsers_only_when_origins_are_allowed(origins, allowed):
    app, engine, tokenizer = make_app()
    app = build_app(engine, tokenizer, MODEL, 64, allowed_origins=origins, api_key="secret")
    async with client_for(app) as client:
        preflight = await client.options("/v1/chat/completions", headers={
            "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        models = await client.get("/v1/models", headers={"Origin": "http://localhost:3000",
                                                         "Authorization": "Bearer secret"})
    assert preflight.headers.get("access-control-allow-origin") == allowed
    assert models.status_code == 200 and models.headers.get("access-control-allow-origin") == allowed
