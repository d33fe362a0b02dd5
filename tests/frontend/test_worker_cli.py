"""`tinyvllm serve --external-workers --worker-address ... --worker-secret` and `tinyvllm worker`: the flags reach
the engine, mistakes are refused before anything starts, the launcher starts only the scheduler (the secret in
its environment, never on a command line), and a standalone worker does not die with its parent."""
import json

import pytest

import tinyvllm.workers.main as worker_main
from tinyvllm.frontend.cli import main as cli
from tinyvllm.frontend.engine.launcher import EngineProcesses
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.process_args import WorkerArgs

SECRET = "cli-test-secret-0123456789"


def test_serve_passes_the_worker_flags_and_the_secret(serve_calls, monkeypatch):
    assert cli.main(["serve", "--external-workers", "--worker-address", "tcp://0.0.0.0:7000", "-pp", "2"]) == 0
    monkeypatch.setenv("TINYVLLM_WORKER_SECRET", SECRET)
    assert cli.main(["serve", "--external-workers", "--worker-address", "tcp://0.0.0.0:7000"]) == 0
    assert [(a.parallel.external_workers, a.parallel.worker_address, a.parallel.worker_secret)
            for a, _ in serve_calls] == \
        [(True, "tcp://0.0.0.0:7000", ""), (True, "tcp://0.0.0.0:7000", SECRET)]
    assert SECRET not in repr(serve_calls[1][0])


@pytest.mark.parametrize("change, message", [
    ({"worker_address": "tcp://0.0.0.0:7000"}, "--external-workers and --worker-address go together"),
    ({"external_workers": True}, "--external-workers and --worker-address go together"),
    ({"external_workers": True, "worker_address": "10.0.0.1:7000"}, "must be tcp://HOST:PORT or ipc://PATH"),
    ({"external_workers": True, "worker_address": "tcp://0.0.0.0:7000"},
     "--worker-address tcp://0.0.0.0:7000 is reachable from other machines: set a shared secret"),
])
def test_engine_args_refuse(change, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.of(**change).validate()
    # loopback: no secret needed
    EngineConfig.of(external_workers=True, worker_address="tcp://127.0.0.1:7000").validate()


def test_serve_refuses_a_short_secret(serve_calls, capsys):
    assert cli.main(["serve", "--worker-secret", "short"]) == 2
    assert "at least 16 characters" in capsys.readouterr().err and not serve_calls


def test_the_launcher_starts_only_the_scheduler(tiny_model):
    procs = EngineProcesses(EngineConfig.of(model=tiny_model, pipeline_parallel_size=2, external_workers=True,
                                            worker_address="tcp://0.0.0.0:7000", worker_secret=SECRET))
    try:
        (scheduler,) = procs.processes
        endpoints, args = json.loads(scheduler.command[-1])
        assert endpoints["workers"] == "tcp://0.0.0.0:7000" and endpoints["scheduler_input"].startswith("ipc://")
        parallel = args["engine"]["parallel"]
        assert (parallel["tensor_parallel_size"], parallel["pipeline_parallel_size"], args["n_layers"]) == (1, 2, 2)
        assert parallel["worker_secret"] == ""
        assert args["model_fingerprint"].startswith("llama 2 layers dim 64")
        assert scheduler.env == {"TINYVLLM_WORKER_SECRET": SECRET} and SECRET not in " ".join(scheduler.command)
    finally:
        procs.stop()


@pytest.mark.parametrize("argv, message", [
    (["--connect", "tcp://10.0.0.1:7000", "--rank", "0"], "--connect tcp://10.0.0.1:7000 is reachable from other"),
    (["--connect", "tcp://127.0.0.1:7000", "--rank", "2", "-pp", "2"], "--rank must be between 0 and 1"),
    (["--connect", "10.0.0.1:7000", "--rank", "0"], "--connect must be tcp://HOST:PORT or ipc://PATH"),
    (["--connect", "tcp://127.0.0.1:7000", "--rank", "1", "-pp", "2", "--stage-address", "tcp://0.0.0.0:7100"],
     "--stage-address must name an address the previous stage can reach"),
    (["--connect", "tcp://127.0.0.1:7000", "--rank", "1", "-pp", "2", "--stage-address", "tcp://10.0.0.2:7100"],
     "--stage-address tcp://10.0.0.2:7100 is reachable from other machines"),
    (["--connect", "tcp://127.0.0.1:7000", "--rank", "0", "-tp", "3"], "--tensor-parallel-size 3 does not split"),
    (["--connect", "tcp://no-such-host.invalid:7000", "--rank", "1", "-pp", "2"],
     "cannot find this machine's address towards tcp://no-such-host.invalid:7000"),
])
def test_worker_refuses_mistakes_before_starting(argv, message, tiny_model, monkeypatch, capsys):
    monkeypatch.delenv("TINYVLLM_WORKER_SECRET", raising=False)
    monkeypatch.setattr(worker_main, "run_worker", lambda *a, **k: pytest.fail("the worker started"))
    assert cli.main(["worker", "--model", tiny_model, *argv]) == 2
    assert message in capsys.readouterr().err


def test_worker_starts_standalone(tiny_model, monkeypatch):
    calls = []
    monkeypatch.setattr(worker_main, "run_worker", lambda endpoint, args, **kw: calls.append((endpoint, args, kw)) or 0)
    monkeypatch.setenv("TINYVLLM_WORKER_SECRET", SECRET)
    assert cli.main(["worker", "--model", tiny_model, "--connect", "tcp://127.0.0.1:7000", "--rank", "1", "-pp", "2",
                     "--cpu-kernels", "tinygrad"]) == 0
    (endpoint, args, kw), = calls
    assert endpoint == "tcp://127.0.0.1:7000" and kw == {"secret": SECRET, "started_by_launcher": False}
    assert (args.rank, args.world_size, args.pp_size, args.engine.kernels.kernels, args.engine.kernels.jit_warmup) == \
        (1, 2, 2, "tinygrad", True)
    assert args.stage_address == "tcp://127.0.0.1:0"  # where the route to the scheduler leaves this machine


@pytest.mark.parametrize("by_launcher", [True, False])
def test_only_a_launchers_worker_dies_with_its_parent(by_launcher, monkeypatch):
    followed = []
    monkeypatch.setattr(worker_main, "exit_with_parent", lambda: followed.append(True))
    monkeypatch.setattr(worker_main, "serve_steps", lambda endpoint, args, secret: 0)
    monkeypatch.setattr(worker_main.signal, "signal", lambda *a: None)  # keep pytest's own handlers
    assert worker_main.run_worker("ipc:///nowhere", WorkerArgs(EngineConfig()), secret="",
                                  started_by_launcher=by_launcher) == 0
    assert followed == ([True] if by_launcher else [])
