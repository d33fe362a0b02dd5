"""`tinyvllm serve --kernels c|tinygrad` (or its old name --cpu-kernels) reaches the engine config and, through the
launcher, every worker's WorkerArgs (which configures the device and builds the model with it:
tests/workers/test_kernel_set.py)."""
import json

import pytest

from tinyvllm.frontend.cli import main as cli
from tinyvllm.frontend.engine.launcher import EngineProcesses
from tinyvllm.protocol.engine_config import EngineConfig


def test_serve_passes_the_kernel_set(serve_calls):
    for argv in (["serve", "--kernels", "tinygrad"], ["serve", "--cpu-kernels", "c"], ["serve"]):
        assert cli.main(argv) == 0
    assert [a.kernels.kernels for a, _ in serve_calls] == ["tinygrad", "c", None]  # None: the device's default


def test_an_unknown_kernel_set_is_refused(serve_calls, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--kernels", "clang"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err and not serve_calls
    for keyword in ("kernels", "cpu_kernels"):
        with pytest.raises(ValueError, match="--kernels must be one of c, c-int8, tinygrad"):
            EngineConfig.of(**{keyword: "clang"}).validate()


def test_help_names_the_option(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--kernels {c,c-int8,tinygrad}" in out and "--cpu-kernels {c,c-int8,tinygrad}" in out


def test_the_launcher_hands_it_to_the_workers(default_model_path):
    processes = EngineProcesses(EngineConfig.of(model=str(default_model_path), kernels="tinygrad")).processes
    workers = [p for p in processes if p.name.startswith("tinyvllm-worker")]
    assert workers and all(json.loads(p.command[-1])[1]["engine"]["kernels"]["kernels"] == "tinygrad"
                           for p in workers)  # WorkerArgs
