"""The router's tests: the anyio backend for the in-process ones."""
import pytest


@pytest.fixture
def anyio_backend():
    return "asyncio"
