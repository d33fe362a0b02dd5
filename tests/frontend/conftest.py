"""Fixtures shared by the frontend tests: the anyio backend, and the app on a fake engine with an httpx client."""
import pytest

from app_harness import client_for, make_app


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def served():
    app, engine, tokenizer = make_app()
    return client_for(app), engine, tokenizer
