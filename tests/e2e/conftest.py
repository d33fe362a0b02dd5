"""End-to-end fixtures: a tiny random model with the real tokenizer, and `tinyvllm serve` as real processes.

`shared_server` (session-scoped) serves every test that leaves the server alive; `server_factory` starts
private servers for the tests that signal or kill them. On teardown both stop their servers with SIGTERM and
fail if any process the server started is still running (after killing it, so nothing outlives the run).
"""
from __future__ import annotations

import pathlib

import openai
import pytest

from tests.e2e.server_process import (REQUEST_TIMEOUT_S, ServerProcess, engine_idle, engine_load, start_server,
                                      wait_until)
from tests.helpers.tiny_model import make_tiny_gguf


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> pathlib.Path:
    return make_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture
def server_factory(tiny_model, tmp_path):
    """start(*extra_cli_args) -> a ready ServerProcess of its own."""
    servers: list[ServerProcess] = []

    def start(*extra_args: str) -> ServerProcess:
        server = start_server(tiny_model, tmp_path / f"server{len(servers)}.log", *extra_args)
        servers.append(server)
        return server

    yield start
    leftovers = {}
    for server in servers:
        if server.stop():
            leftovers[server.log_path.name] = server.leftover_description
    assert not leftovers, f"processes were still running after the test and had to be killed: {leftovers}"


@pytest.fixture(scope="session")
def shared_server(tiny_model, tmp_path_factory):
    server = start_server(tiny_model, tmp_path_factory.mktemp("shared") / "server.log", "--responses-store-size", "8")
    yield server
    alive = server.proc.poll() is None
    left = server.stop()
    assert not left, f"the shared server left processes running: {server.leftover_description}"
    assert not alive or server.proc.returncode == 0, f"exit code {server.proc.returncode}" + server.log_tail()


@pytest.fixture
def server(shared_server) -> ServerProcess:
    """The shared server, checked to be alive and idle before each test."""
    assert shared_server.proc.poll() is None, "the shared server died" + shared_server.log_tail()
    assert wait_until(lambda: engine_idle(shared_server.url), 30), \
        f"the shared server is still busy before the test: {engine_load(shared_server.url)}"
    return shared_server


@pytest.fixture
def client(server):
    """The official `openai` client on the shared server."""
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S,
                       max_retries=0) as c:
        yield c
