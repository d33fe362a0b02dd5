"""deploy/container-entrypoint.sh, the image's entrypoint: per mode, the `tinyvllm` command line it execs (checked by
tinyvllm's own parser) from the flags and the environment; secrets stay in the environment; it execs (SIGTERM
reaches tinyvllm); a worker in a LeaderWorkerSet gets its rank from the pod's index and waits for the leader's name."""
import pytest

from tests.deploy.entrypoint_runner import ENTRYPOINT, run_entrypoint
from tinyvllm.frontend.cli.main import build_parser

SECRETS = {"TINYVLLM_API_KEY": "api-key-0123456789abcdef", "TINYVLLM_WORKER_SECRET": "worker-secret-0123456789",
           "TINYVLLM_ROUTER_SECRET": "router-secret-0123456789"}


def parsed(argv):
    return build_parser().parse_args(argv)


def test_it_is_executable_bash():
    assert ENTRYPOINT.stat().st_mode & 0o111 and ENTRYPOINT.read_text().startswith("#!/usr/bin/env bash\n")


def test_serve_binds_every_address_in_a_pod_and_execs(tmp_path):
    for args in ([], ["serve"]):
        run = run_entrypoint(tmp_path, args, {})
        assert run.returncode == 0, run.stderr
        assert run.argv == ["serve", "--host", "0.0.0.0", "--port", "8000"]
        assert run.pid == run.popen_pid  # exec'd: tinyvllm is the process the container runtime signals


def test_serve_maps_the_environment_and_flags_override_it(tmp_path):
    env = {"HOST": "127.0.0.1", "PORT": "9000", "MODEL": "/models/m.gguf", "TENSOR_PARALLEL_SIZE": "2",
           "PIPELINE_PARALLEL_SIZE": "3", "DEV": "CUDA"}
    run = run_entrypoint(tmp_path, ["serve", "--port", "9100", "--max-num-seqs", "8"], env)
    args = parsed(run.argv)
    assert (args.command, args.host, args.port, args.model) == ("serve", "127.0.0.1", 9100, "/models/m.gguf")
    assert (args.tensor_parallel_size, args.pipeline_parallel_size, args.max_num_seqs) == (2, 3, 8)
    assert run.env["DEV"] == "CUDA"  # tinygrad reads it from the environment


def test_flags_alone_are_serves(tmp_path):
    run = run_entrypoint(tmp_path, ["--max-num-seqs", "4"], {})
    assert parsed(run.argv).max_num_seqs == 4 and run.argv[0] == "serve"


@pytest.mark.parametrize("mode", ["serve", "worker", "router"])
def test_secrets_stay_in_the_environment(tmp_path, mode):
    env = {**SECRETS, "TINYVLLM_SCHEDULER": "tcp://10.0.0.1:7000", "WORKER_RANK": "0"}
    run = run_entrypoint(tmp_path, [mode], env)
    assert run.returncode == 0, run.stderr
    assert not any(secret in arg for secret in SECRETS.values() for arg in run.argv)
    assert {k: run.env[k] for k in SECRETS} == SECRETS
    assert not any(arg.endswith(("-secret", "-key")) for arg in run.argv)


def test_worker_maps_the_scheduler_rank_model_and_sizes(tmp_path):
    env = {"TINYVLLM_SCHEDULER": "tcp://10.0.0.1:7000", "WORKER_RANK": "3", "MODEL": "/models/m.gguf",
           "TENSOR_PARALLEL_SIZE": "2", "PIPELINE_PARALLEL_SIZE": "2"}
    run = run_entrypoint(tmp_path, ["worker", "--beam", "2"], env)
    args = parsed(run.argv)
    assert (args.command, args.connect, args.rank, args.model, args.beam) == ("worker", "tcp://10.0.0.1:7000", 3,
                                                                              "/models/m.gguf", 2)
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (2, 2)
    assert run.getent_calls == 0  # an address, not a name: nothing to wait for


@pytest.mark.parametrize("index,tp,tp_rank,rank", [("0", "1", None, 0), ("1", "1", None, 1), ("0", "2", "1", 1),
                                                   ("1", "2", "0", 2), ("3", "4", "2", 14)])
def test_a_leaderworkerset_worker_takes_its_rank_from_the_pod_index(tmp_path, index, tp, tp_rank, rank):
    env = {"LWS_WORKER_INDEX": index, "TENSOR_PARALLEL_SIZE": tp, "TINYVLLM_SCHEDULER": "tcp://10.0.0.1:7000"}
    if tp_rank is not None:
        env["TP_RANK"] = tp_rank
    run = run_entrypoint(tmp_path, ["worker"], env)
    assert parsed(run.argv).rank == rank  # pipeline stage (the pod's index) x tensor-parallel size + tp rank


@pytest.mark.parametrize("env,message", [({"LWS_WORKER_INDEX": "1", "TENSOR_PARALLEL_SIZE": "2", "TP_RANK": "2"},
                                          "TP_RANK 2 is not below TENSOR_PARALLEL_SIZE 2"),
                                         ({"WORKER_RANK": "one"}, "WORKER_RANK must be a whole number"),
                                         ({"TENSOR_PARALLEL_SIZE": "2x"}, "TENSOR_PARALLEL_SIZE must be")])
def test_a_bad_layout_is_a_usage_error(tmp_path, env, message):
    run = run_entrypoint(tmp_path, ["worker"], env)
    assert run.returncode == 2 and message in run.stderr and run.argv is None


def test_a_worker_waits_for_the_leaders_name_to_resolve(tmp_path):
    env = {"TINYVLLM_SCHEDULER": "tcp://tinyvllm-group-0.tinyvllm-group.default:7000", "WORKER_RANK": "1"}
    run = run_entrypoint(tmp_path, ["worker"], env, getent_failures=2)
    assert run.returncode == 0 and run.getent_calls == 3
    assert parsed(run.argv).connect == env["TINYVLLM_SCHEDULER"]
    assert "waiting for tinyvllm-group-0.tinyvllm-group.default to resolve" in run.stderr


def test_a_worker_gives_up_on_a_name_that_never_resolves(tmp_path):
    env = {"TINYVLLM_SCHEDULER": "tcp://nowhere.invalid:7000", "WORKER_RANK": "1", "WAIT_FOR_SCHEDULER_S": "1"}
    run = run_entrypoint(tmp_path, ["worker"], env, getent_failures=100)
    assert run.returncode == 1 and run.argv is None and "did not resolve within 1 s" in run.stderr


def test_router_binds_every_address_on_8080(tmp_path):
    run = run_entrypoint(tmp_path, ["router", "--discover-dns", "tinyvllm-engines:8000"], {})
    assert run.argv == ["router", "--host", "0.0.0.0", "--port", "8080", "--discover-dns", "tinyvllm-engines:8000"]
    assert run.pid == run.popen_pid


def test_anything_else_runs_as_given(tmp_path):
    run = run_entrypoint(tmp_path, ["tinyvllm", "bench", "serve", "--help"], {})
    assert run.argv == ["bench", "serve", "--help"] and run.pid == run.popen_pid
