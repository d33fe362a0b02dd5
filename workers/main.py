"""A worker process: loads the model, says hello to the scheduler, allocates its KV cache when told how,
then runs every StepPlan it receives and answers with a StepResult."""
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass

import zmq

from tinyvllm.protocol.messages import InitWorker, Shutdown, StepPlan, WorkerError, WorkerHello, WorkerReady, WorkerRole
from tinyvllm.protocol.process_guard import exit_with_parent
from tinyvllm.protocol.transport import make_socket, recv, send

log = logging.getLogger("tinyvllm.worker")


class WarmupProgress:
    """A progress bar on stderr for the start-up captures: one line, redrawn in place on a terminal."""

    def __init__(self, name: str, width: int = 24):
        self.name, self.width, self.start = name, width, time.monotonic()
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int, what: str) -> None:
        filled = self.width * done // total
        line = (f"{self.name}: capturing jitted steps [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} "
                f"({what}) {time.monotonic() - self.start:.0f}s")
        end = "\n" if done == total or not self.tty else ""
        print(("\r" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)


@dataclass(slots=True)
class WorkerArgs:
    model: str | None
    rank: int = 0
    world_size: int = 1
    role: str = WorkerRole.MIXED
    jit_warmup: bool = False
    beam: int = 0
    kernels: str | None = None  # the kernel set (workers/kernel_set.py); None: the device's default
    tp_size: int = 1
    pp_size: int = 1
    stage_address: str = ""  # where this worker receives the previous pipeline stage's output (not on the first)

    @property
    def spec(self):
        from tinyvllm.protocol.parallel_layout import ShardSpec
        return ShardSpec.of_rank(self.rank, self.tp_size, self.pp_size)


def build_runner(args: WorkerArgs, init: InitWorker, link=None):
    from tinygrad import Device
    from tinyvllm.protocol.parallel_layout import check_parallel_sizes
    from tinyvllm.workers.kernel_set import configure_device, default_kernel_set
    from tinyvllm.workers.kv_cache import PagedKVCache, blocks_for_budget
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.model_runner import ModelRunner
    from tinyvllm.workers.tensor_parallel import shard_weights
    from tinyvllm.workers.weights import load_weights
    spec = args.spec
    cfg, weights = load_weights(args.model)
    check_parallel_sizes(cfg, spec.tp_size, spec.pp_size)
    vocab_start = None
    if spec.world_size > 1:
        cfg, weights, vocab_start = shard_weights(cfg, weights, spec)
        vocab_start = vocab_start if spec.tp_size > 1 else None
    num_blocks = init.num_blocks or blocks_for_budget(cfg, init.block_size, init.kv_cache_bytes)
    kernels = args.kernels or default_kernel_set(Device.DEFAULT)
    configure_device(Device.DEFAULT, kernels)
    model = Transformer(cfg, weights, init.max_model_len, kernels=kernels, vocab_start=vocab_start)
    del weights
    cache = PagedKVCache(cfg, num_blocks, init.block_size)
    group = None
    if spec.tp_size > 1:  # the largest exchange: a bucket's residual stream, or its sampling rows' logits shard
        rows = min(init.max_num_seqs, init.max_num_batched_tokens)
        max_bytes = 4 * max(init.max_num_batched_tokens * cfg.dim, rows * model.output.shape[0] if model.output is not None else 0)
        from tinyvllm.workers.collective import HostGroup
        group = HostGroup(f"{init.group_id}-stage{spec.pp_rank}", spec.tp_rank, spec.tp_size, max_bytes)
    if link is not None and init.next_stage_address:
        link.connect_next(init.next_stage_address)
    runner = ModelRunner(model, cache, init.max_num_seqs, init.max_model_len, init.max_num_batched_tokens,
                         spec, group, link)
    if args.jit_warmup:
        runner.warm_up(WarmupProgress(f"worker{args.rank}"))
    return runner


def run_worker(workers_endpoint: str, args: WorkerArgs) -> None:
    """Process entry point."""
    exit_with_parent()
    if cores := os.environ.get("TINYVLLM_CPU_CORES"):  # the launcher's share of this machine's cores
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker{args.rank} %(levelname)s %(message)s")
    from tinygrad import Context
    with Context(BEAM=args.beam):
        serve_steps(workers_endpoint, args)


def serve_steps(workers_endpoint: str, args: WorkerArgs) -> None:
    from tinygrad import Device
    from tinyvllm.workers.stage_link import StageLink
    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.DEALER, workers_endpoint, bind=False, identity=f"worker-{args.rank}".encode())
    link = None
    if args.pp_size > 1:  # a later stage listens for its input (by default on a free loopback port)
        link = StageLink(ctx, None if args.spec.first_stage else args.stage_address or "tcp://127.0.0.1:0")
    send(sock, WorkerHello(args.rank, args.world_size, args.role, os.getpid(), Device.DEFAULT, args.tp_size,
                           args.pp_size, link.address if link is not None else ""))
    runner = None
    try:
        while True:
            msg = recv(sock)
            if isinstance(msg, InitWorker):
                runner = build_runner(args, msg, link)
                log.info("rank %d (tp %d/%d, pp %d/%d): %.1f MB of weights, %d KV blocks", args.rank,
                         args.spec.tp_rank, args.tp_size, args.spec.pp_rank, args.pp_size,
                         runner.model.weight_nbytes / 1e6, runner.cache.num_blocks)
                send(sock, WorkerReady(args.rank, runner.cache.num_blocks, runner.cache.block_size, msg.max_model_len,
                                       runner.model.weight_nbytes))
            elif isinstance(msg, StepPlan):
                send(sock, runner.execute(msg, args.rank))
            elif isinstance(msg, Shutdown):
                break
    except KeyboardInterrupt:
        pass
    except Exception:
        log.exception("worker failed")
        send(sock, WorkerError(args.rank, traceback.format_exc(limit=5)))
    finally:
        if runner is not None and runner.group is not None:
            runner.group.close()
        ctx.destroy(linger=200)

if __name__ == "__main__":  # started by frontend/launcher.py as a program of its own
    from tinyvllm.protocol.child_process import child_args
    endpoint, worker_args = child_args(sys.argv)
    run_worker(endpoint, WorkerArgs(**worker_args))
