"""protocol/worker_auth.py (which addresses need a secret, the proofs) and protocol/compatibility.py (the model's
fingerprint, why a worker cannot join)."""
import dataclasses
import shutil

import pytest

from tests.helpers.tiny_model import make_tiny_gguf
from tinyvllm.protocol.compatibility import EngineShape, compatibility_problem, model_fingerprint, tinyvllm_version
from tinyvllm.protocol.messages import WorkerHello
from tinyvllm.protocol.worker_auth import (is_loopback, new_nonce, proof_matches, require_secret_beyond_loopback,
                                           resolve_worker_secret, scheduler_proof, seal, stage_link_key,
                                           worker_proof)

SECRET = "a-secret-of-enough-length"


@pytest.mark.parametrize("address, loopback", [
    ("ipc:///tmp/x/workers", True), ("tcp://127.0.0.1:7000", True), ("tcp://127.8.9.1:7000", True),
    ("tcp://localhost:7000", True), ("tcp://[::1]:7000", True), ("tcp://0.0.0.0:7000", False),
    ("tcp://10.0.0.2:7000", False), ("tcp://*:7000", False), ("tcp://gpu-box:7000", False), ("tcp://[::]:7000", False),
])
def test_which_addresses_other_machines_reach(address, loopback):
    assert is_loopback(address) == loopback


def test_a_secret_is_required_beyond_loopback():
    require_secret_beyond_loopback("", worker_address="tcp://127.0.0.1:7000", stage_address="ipc:///tmp/s")
    require_secret_beyond_loopback(SECRET, worker_address="tcp://0.0.0.0:7000")
    with pytest.raises(ValueError, match=r"--stage-address tcp://10\.0\.0\.3:0 is reachable from other machines: set "
                                         r"a shared secret in TINYVLLM_WORKER_SECRET"):
        require_secret_beyond_loopback("", connect="tcp://127.0.0.1:7000", stage_address="tcp://10.0.0.3:0")


def test_the_flag_wins_and_a_short_secret_is_refused():
    env = {"TINYVLLM_WORKER_SECRET": "from-the-environment"}
    assert resolve_worker_secret(None, env) == "from-the-environment"
    assert resolve_worker_secret(SECRET, env) == SECRET
    assert resolve_worker_secret(None, {}) == ""
    with pytest.raises(ValueError, match="at least 16 characters"):
        resolve_worker_secret("short", {})


def test_proofs_need_the_secret_and_cannot_stand_in_for_each_other():
    nw, ns, hello = new_nonce(), new_nonce(), b"hello bytes"
    assert len(nw) == 32 and nw != ns
    assert proof_matches(scheduler_proof(SECRET, nw, ns), scheduler_proof(SECRET, nw, ns))
    assert not proof_matches(scheduler_proof(SECRET, nw, ns), scheduler_proof(SECRET + "x", nw, ns))
    assert not proof_matches(worker_proof(SECRET, ns, nw, hello), worker_proof(SECRET, ns, nw, hello + b"!"))
    assert not proof_matches(worker_proof(SECRET, ns, nw, b""), scheduler_proof(SECRET, ns, nw))
    keys = {stage_link_key(SECRET, "group-a", 1), stage_link_key(SECRET, "group-a", 2),
            stage_link_key(SECRET, "group-b", 1)}
    assert len(keys) == 3
    key = stage_link_key(SECRET, "group-a", 1)
    assert seal(key, b"\0", b"ab", b"c") != seal(key, b"\0", b"a", b"bc")  # frames are not just concatenated


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    tiny = make_tiny_gguf(folder / "tiny.gguf")
    renamed = shutil.copy(tiny, folder / "renamed copy.gguf")
    return tiny, renamed, make_tiny_gguf(folder / "seed1.gguf", seed=1), make_tiny_gguf(folder / "4.gguf", n_layers=4)


def test_the_fingerprint_follows_the_content_not_the_name(models):
    tiny, renamed, other_seed, more_layers = map(model_fingerprint, models)
    assert tiny == renamed and tiny.startswith("llama 2 layers dim 64 vocab 49152")
    assert len({tiny, other_seed, more_layers}) == 3 and more_layers.startswith("llama 4 layers")


EXPECTED = EngineShape(tinyvllm_version(), "model #1", tp_size=2, pp_size=2, n_layers=30)
GOOD = WorkerHello(3, 4, "both", 99, "CUDA:1", 2, 2, "tcp://10.0.0.2:7100", tinyvllm_version(), "model #1",
                   [15, 30], new_nonce())


@pytest.mark.parametrize("change, reason", [
    ({}, None),
    ({"version": "0.0.1"}, f"tinyvllm 0.0.1 on the worker, {tinyvllm_version()} here"),
    ({"tp_size": 4, "pp_size": 1},
     "started with --tensor-parallel-size 4 --pipeline-parallel-size 1, this engine runs 2 x 2"),
    ({"rank": 4}, "rank 4 of 4 workers; this engine has 4"),
    ({"world_size": 8}, "rank 3 of 8 workers; this engine has 4"),
    ({"model_fingerprint": "model #2"},
     "a different model: the worker loaded [model #2], this engine serves [model #1]"),
    ({"layers": [0, 15]}, "it would hold layers [0, 15]; this engine gives rank 3 layers [15, 30]"),
])
def test_why_a_worker_cannot_join(change, reason):
    problem = compatibility_problem(EXPECTED, dataclasses.replace(GOOD, **change))
    assert problem == reason if reason is None else problem.startswith(reason)
