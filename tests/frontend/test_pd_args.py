"""`tinyvllm serve --role prefill|decode` flags: a KV side channel other machines reach needs --kv-secret (or
$TINYVLLM_KV_SECRET), a short one is refused, and the launcher hands it to the scheduler and the workers in their
environment, never on a command line."""
import json

import pytest

from tinyvllm.frontend.cli import main as cli
from tinyvllm.frontend.engine.launcher import EngineProcesses
from tinyvllm.protocol.engine_config import EngineConfig

SECRET = "kv-test-secret-0123456789"


@pytest.mark.parametrize("change, message", [
    ({"role": "prefill", "kv_host": "10.0.0.5"}, "--kv-host 10.0.0.5 is reachable from other machines"),
    ({"role": "prefill", "kv_host": "0.0.0.0"}, "TINYVLLM_KV_SECRET"),
    ({"role": "prefill", "kv_lease_s": 0}, "--kv-lease-seconds must be positive"),
    ({"role": "prefill", "tensor_parallel_size": 2}, "needs --kv-port"),
    ({"role": "prefill", "kv_host": "0.0.0.0", "kv_secret": SECRET}, "is not an address"),
    ({"role": "prefill", "external_workers": True, "worker_address": "tcp://127.0.0.1:7000"}, "own workers"),
    ({"role": "decode", "speculative_config": {"method": "draft_model", "model": "d.gguf"}}, "ngram method"),
])
def test_engine_args_refuse(change, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.of(**change).validate()
    EngineConfig.of(role="prefill", kv_host="10.0.0.5", kv_secret=SECRET).validate()
    EngineConfig.of(role="prefill").validate()  # loopback: no secret needed


def test_serve_takes_the_kv_secret_from_the_flag_or_the_environment(serve_calls, monkeypatch, capsys):
    assert cli.main(["serve", "--role", "decode", "--kv-secret", SECRET]) == 0
    monkeypatch.setenv("TINYVLLM_KV_SECRET", SECRET + "-env")
    assert cli.main(["serve", "--role", "prefill", "--kv-host", "0.0.0.0"]) == 0
    assert [(a.kv_transfer.role, a.kv_transfer.kv_secret) for a, _ in serve_calls] == \
        [("decode", SECRET), ("prefill", SECRET + "-env")]
    assert SECRET not in repr(serve_calls[0][0])
    assert cli.main(["serve", "--role", "decode", "--kv-secret", "short"]) == 2
    assert "KV secret is too short" in capsys.readouterr().err


def test_the_launcher_gives_the_kv_secret_to_its_children_in_their_environment(tiny_model):
    procs = EngineProcesses(EngineConfig.of(model=tiny_model, role="prefill", kv_secret=SECRET))
    try:
        assert {p.env.get("TINYVLLM_KV_SECRET") for p in procs.processes} == {SECRET}
        assert all(SECRET not in " ".join(p.command) for p in procs.processes)
        worker = next(p for p in procs.processes if "workers" in p.command[-2] or "worker" in p.name)
        assert json.loads(worker.command[-1])[1]["kv_address"] == "tcp://127.0.0.1:0"
    finally:
        procs.stop()


@pytest.mark.parametrize("kv", [{"remote_host": "bad host"}, {"remote_host": "a/b"}, {"tp_size": 100000},
                                {"remote_request_id": "x" * 300}])
def test_kv_transfer_params_a_client_may_not_send(kv):
    from pydantic import ValidationError

    from tinyvllm.frontend.api.openai_requests import CompletionRequest
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": "hi", "kv_transfer_params": kv})
    CompletionRequest.model_validate({"model": "m", "prompt": "hi", "kv_transfer_params": {
        "remote_host": "10.0.0.5", "tp_size": 2, "do_remote_prefill": True}})
