"""`tinyvllm serve --cpu-kernels c|tinygrad` reaches the engine args and, through the launcher, every worker's
WorkerArgs (which configures the device and builds the model with it: tests/workers/test_kernel_set.py)."""
import json

import pytest

from tinyvllm.frontend import cli
from tinyvllm.frontend.launcher import EngineArgs, EngineProcesses


def test_serve_passes_the_kernel_set(serve_calls):
    for argv in (["serve", "--cpu-kernels", "tinygrad"], ["serve", "--cpu-kernels", "c"], ["serve"]):
        assert cli.main(argv) == 0
    assert [a.cpu_kernels for a, _ in serve_calls] == ["tinygrad", "c", None]  # None: the device's default


def test_an_unknown_kernel_set_is_refused(serve_calls, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--cpu-kernels", "clang"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err and not serve_calls
    with pytest.raises(ValueError, match="--cpu-kernels"):
        EngineArgs(cpu_kernels="clang").validate()


def test_help_names_the_option(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert "--cpu-kernels {c,c-int8,tinygrad}" in capsys.readouterr().out


def test_the_launcher_hands_it_to_the_workers(default_model_path):
    processes = EngineProcesses(EngineArgs(model=str(default_model_path), cpu_kernels="tinygrad")).processes
    workers = [p for p in processes if p.name.startswith("tinyvllm-worker")]
    assert workers and all(json.loads(p.command[-1])[1]["kernels"] == "tinygrad" for p in workers)  # WorkerArgs
