"""`tinyvllm worker` (a worker on its own, on any machine) and `tinyvllm serve`'s flags for waiting for such workers."""
import argparse
import dataclasses
import os
import sys

from tinyvllm.protocol.device_placement import device_placement
from tinyvllm.protocol.engine_config import EngineConfig, add_engine_flags
from tinyvllm.protocol.worker_auth import require_secret_beyond_loopback, resolve_worker_secret

DESCRIPTION = """One worker process, on this or another machine, for a scheduler started with `tinyvllm serve
--external-workers`: one per device, the ranks 0 .. tensor x pipeline-parallel size - 1. See docs/DEPLOY.md.

    export TINYVLLM_WORKER_SECRET=...   # the server's
    tinyvllm worker --connect tcp://10.0.0.1:7000 --rank 1 -tp 1 -pp 2 --model model.gguf

Exit codes: 0 when the server stops, 1 on a failure, 2 on a usage error, 3 when the scheduler refuses this worker
(another secret, model or version; a rank taken) or cannot prove it knows the secret."""
# what a worker decides for itself; the rest of the engine's configuration comes from the scheduler (InitWorker)
WORKER_KNOBS = ("model", "tensor_parallel_size", "pipeline_parallel_size", "kernels", "beam", "jit_warmup",
                "worker_secret")


def add_arguments(worker: argparse.ArgumentParser) -> None:
    worker.add_argument("--connect", required=True, help="the scheduler's --worker-address, e.g. tcp://10.0.0.1:7000")
    worker.add_argument("--rank", type=int, required=True,
                        help="this worker's rank: pipeline stage x tensor-parallel size + tensor-parallel rank")
    worker.add_argument("--stage-address", default=None,
                        help="a later pipeline stage: where it receives the previous stage's output, e.g. "
                             "tcp://10.0.0.2:7100; default: this machine's address on the route to the scheduler, "
                             "a port the system picks")
    worker.add_argument("--local-index", type=int, default=None, metavar="I",
                        help="this is the I-th (from 0) of --local-count workers on this machine: it takes device I of "
                             "DEV's backend (CUDA:I), or on the CPU its share of the cores, as `tinyvllm serve` places "
                             "its own workers (what deploy/workers.sh passes)")
    worker.add_argument("--local-count", type=int, default=None, metavar="N",
                        help="with --local-index: how many workers this machine runs")
    add_engine_flags(worker, only=WORKER_KNOBS, helps={
        "model": "the same model as the server's (a copy on this machine)",
        "tensor_parallel_size": "as given to `tinyvllm serve`",
        "pipeline_parallel_size": "as given to `tinyvllm serve`"})


def default_stage_address(connect: str) -> str:
    """This host's address towards the scheduler, port chosen by the system; ValueError if that host has no route."""
    from tinyvllm.protocol.transport import local_ip_towards
    if not connect.startswith("tcp://"):
        return "tcp://127.0.0.1:0"
    try:
        return f"tcp://{local_ip_towards(connect)}:0"
    except OSError as e:  # an unknown host name (socket.gaierror) or no route to it
        raise ValueError(f"cannot find this machine's address towards {connect} ({e}): check the host name, or "
                         f"give --stage-address") from None


def worker_args_from(args: argparse.Namespace):
    """WorkerArgs for the command's flags; raises ValueError or FileNotFoundError on a mistake."""
    from tinyvllm.protocol.model_config import read_model_config
    from tinyvllm.protocol.model_path import resolve_model_path
    from tinyvllm.protocol.parallel_layout import check_parallel_sizes
    from tinyvllm.protocol.process_args import WorkerArgs
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    if tp < 1 or pp < 1 or not 0 <= args.rank < tp * pp:
        raise ValueError(f"--rank must be between 0 and {tp * pp - 1} for {tp} x {pp} workers")
    if not args.connect.startswith(("tcp://", "ipc://")):
        raise ValueError(f"--connect must be tcp://HOST:PORT or ipc://PATH, not {args.connect!r}")
    model = resolve_model_path(args.model)
    check_parallel_sizes(read_model_config(model), tp, pp)
    stage_address = ""
    if args.rank >= tp:  # a later pipeline stage listens for its input
        stage_address = args.stage_address or default_stage_address(args.connect)
        if any(f"//{host}:" in stage_address for host in ("0.0.0.0", "*", "[::]")):
            raise ValueError("--stage-address must name an address the previous stage can reach, not 0.0.0.0")
    config = EngineConfig.from_namespace(args)
    return WorkerArgs(dataclasses.replace(config, model=dataclasses.replace(config.model, model=str(model))),
                      args.rank, stage_address)


def placement_from(args: argparse.Namespace, environ) -> dict[str, str]:
    """The environment --local-index/--local-count place this worker with (protocol/device_placement.py)."""
    if (args.local_index is None) != (args.local_count is None):
        raise ValueError("--local-index and --local-count go together")
    if args.local_count is None:
        return {}
    if not 0 <= args.local_index < args.local_count:
        raise ValueError(f"--local-index must be between 0 and {args.local_count - 1}")
    return device_placement(args.local_index, args.local_count, environ)


def run(args: argparse.Namespace) -> int:
    from tinyvllm.workers.main import run_worker
    try:
        secret = resolve_worker_secret(args.worker_secret, os.environ)
        worker_args = worker_args_from(args)
        os.environ.update(placement_from(args, os.environ))  # before the worker's code brings tinygrad in
        require_secret_beyond_loopback(secret, connect=args.connect, stage_address=worker_args.stage_address)
    except (ValueError, FileNotFoundError) as e:
        print(f"tinyvllm worker: error: {e}", file=sys.stderr)
        return 2
    return run_worker(args.connect, worker_args, secret=secret, started_by_launcher=False)
