"""Fixtures shared by the frontend tests: the anyio backend, the app on a fake engine with an httpx client, and what
`tinyvllm serve` would have served."""
import pytest

import tinyvllm.frontend.api.server as server_module
from app_harness import client_for, make_app


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def served():
    app, engine, tokenizer = make_app()
    return client_for(app), engine, tokenizer


@pytest.fixture
def serve_calls(monkeypatch) -> list:
    """(engine_config, server_args) of each server.serve call `cli.main(["serve", ...])` makes; nothing is served. The
    API key and worker secret variables are cleared: only what the test sets is seen."""
    calls = []
    monkeypatch.setattr(server_module, "serve",
                        lambda engine_config, server_args: calls.append((engine_config, server_args)))
    monkeypatch.delenv("TINYVLLM_API_KEY", raising=False)
    monkeypatch.delenv("TINYVLLM_WORKER_SECRET", raising=False)
    return calls
