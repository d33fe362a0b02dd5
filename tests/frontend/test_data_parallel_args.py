"""`--data-parallel-size` and `--step-timeout` reach the EngineConfig; bad values are refused; each replica's workers
take the devices and ports after the previous replica's."""
import dataclasses
import json

import pytest

from tinyvllm.frontend.cli import main as cli
from tinyvllm.frontend.engine.launcher import EngineProcesses
from tinyvllm.protocol.engine_config import EngineConfig


def test_the_flags_reach_the_engine_args(serve_calls):
    assert cli.main(["serve", "-dp", "3", "--step-timeout", "7.5"]) == 0
    assert cli.main(["serve"]) == 0
    assert [(a.parallel.data_parallel_size, a.batch.step_timeout_s) for a, _ in serve_calls] == [(3, 7.5), (1, 120.0)]


@pytest.mark.parametrize("args,message", [
    (dict(data_parallel_size=0), "--data-parallel-size must be at least 1"),
    (dict(step_timeout_s=0), "--step-timeout must be positive"),
    (dict(data_parallel_size=2, external_workers=True, worker_address="tcp://127.0.0.1:7000"),
     "--data-parallel-size must be 1"),
])
def test_bad_values_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.of(**args).validate()


def test_a_replicas_workers_take_the_devices_after_the_previous_ones(tiny_model, monkeypatch):
    monkeypatch.setenv("DEV", "CUDA")
    args = EngineConfig.of(model=tiny_model, tensor_parallel_size=2, data_parallel_size=2)
    devices = [[p.env["DEV"] for p in EngineProcesses(args, replica).processes[1:]] for replica in (0, 1)]
    assert devices == [["CUDA:0", "CUDA:1"], ["CUDA:2", "CUDA:3"]]


def test_a_replicas_cpu_cores_and_tcp_ports_come_after_the_previous_ones(tiny_model, monkeypatch):
    monkeypatch.setenv("DEV", "CPU")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    args = EngineConfig.of(model=tiny_model, data_parallel_size=2, transport="tcp", tcp_base_port=6000)
    replicas = [EngineProcesses(args, replica) for replica in (0, 1)]
    assert [r.processes[1].env["TINYVLLM_CPU_CORES"] for r in replicas] == ["0,1,2,3", "4,5,6,7"]
    ports = [{int(e.rsplit(":", 1)[1]) for e in (*dataclasses.astuple(r.endpoints), r.endpoints.stage_input(0))}
             for r in replicas]
    assert not ports[0] & ports[1]
    worker_args = json.loads(replicas[1].processes[1].command[-1])
    assert worker_args[0] == replicas[1].endpoints.workers


def test_workers_over_tcp_prove_a_secret_the_launcher_made(tiny_model, monkeypatch):
    """tcp on loopback is open to every local user: without --worker-secret the launcher makes one (in the
    children's environment, never on a command line); over ipc (a private folder) none is needed."""
    monkeypatch.delenv("TINYVLLM_WORKER_SECRET", raising=False)
    tcp = EngineProcesses(EngineConfig.of(model=tiny_model, tensor_parallel_size=1, transport="tcp"))
    secrets_seen = {p.env.get("TINYVLLM_WORKER_SECRET") for p in tcp.processes}
    assert len(secrets_seen) == 1 and len(secret := secrets_seen.pop() or "") == 64
    assert not any(secret in " ".join(p.command) for p in tcp.processes)
    other = EngineProcesses(EngineConfig.of(model=tiny_model, transport="tcp"))
    assert other.processes[0].env["TINYVLLM_WORKER_SECRET"] != secret
    assert all("TINYVLLM_WORKER_SECRET" not in p.env
               for p in EngineProcesses(EngineConfig.of(model=tiny_model)).processes)
