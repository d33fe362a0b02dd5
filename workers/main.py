"""A worker process: joins the scheduler (workers/scheduler_join.py), loads the model, allocates its KV cache when
told how, then runs every StepPlan it receives and answers with a StepResult.

Started by frontend/engine/launcher.py as a child that dies with its parent, or on its own by `tinyvllm worker` (on any
machine; frontend/cli/worker_command.py). Exit codes: 0 after Shutdown or a signal, 1 on a failure, 3 when refused."""
import logging
import os
import signal
import sys
import time
import traceback

import zmq

from tinyvllm.protocol import codec
from tinyvllm.protocol.gguf_file import forget_parsed_headers
from tinyvllm.protocol.messages import InitWorker, Shutdown, StepPlan, WorkerError, WorkerReady
from tinyvllm.protocol.process_args import WorkerArgs
from tinyvllm.protocol.process_guard import exit_with_parent
from tinyvllm.protocol.transport import send
from tinyvllm.protocol.worker_auth import SECRET_ENV, stage_link_key
from tinyvllm.workers.background_warmup import BackgroundWarmup
from tinyvllm.workers.scheduler_connection import SchedulerWatch, connect_to_scheduler, send_step_result
from tinyvllm.workers.scheduler_join import NoScheduler, WorkerRefusedError, join_scheduler, worker_hello

log = logging.getLogger("tinyvllm.worker")
REFUSED_EXIT_CODE = 3  # a wrong secret, model or version: restarting will not help (systemd: RestartPreventExitStatus)
HELLO_ANSWER_TIMEOUT_S = 600.0  # how long a worker waits for a scheduler to answer its hello
STORE_AT_EXIT_S = 3.0  # captured steps still unwritten at shutdown: written for this long (the launcher waits 5 s)


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


def build_runner(args: WorkerArgs, init: InitWorker, link=None):
    """(the model runner, the model's KV heads: this worker's cache may hold some of them only)."""
    from tinygrad import Device
    from tinyvllm.protocol.parallel_layout import check_parallel_sizes
    from tinyvllm.workers.kernel_set import configure_device, default_kernel_set
    from tinyvllm.workers.draft_model import load_draft, make_draft_model
    from tinyvllm.workers.kv_cache import PagedKVCache, bytes_per_block, cache_dtype
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.model_runner import ModelRunner
    from tinyvllm.workers.tensor_parallel import shard_weights
    from tinyvllm.workers.weights import load_weights
    spec = args.spec
    # what the scheduler dictates (InitWorker) and what this worker decides for itself (its own flags)
    kv, batch, max_model_len, own = init.engine.cache, init.engine.batch, init.engine.model.max_model_len, args.engine
    cfg, weights = load_weights(args.model)
    check_parallel_sizes(cfg, spec.tp_size, spec.pp_size)
    vocab_size = cfg.vocab_size  # the whole vocabulary: the sampling rank sees every logit
    n_kv_heads = cfg.n_kv_heads
    vocab_start = None
    if spec.world_size > 1:
        cfg, weights, vocab_start = shard_weights(cfg, weights, spec)
        vocab_start = vocab_start if spec.tp_size > 1 else None
    draft = load_draft(init.engine.speculative_config, vocab_size)  # (config, weights, k) of a draft model, or None
    kernels = own.kernels.kernels or default_kernel_set(Device.DEFAULT)
    kv_dtype = cache_dtype(kv.kv_cache_dtype, kernels)
    block_bytes = bytes_per_block(cfg, kv.block_size, kv_dtype)
    if draft is not None:  # the draft's cache has as many blocks
        block_bytes += bytes_per_block(draft[0], kv.block_size, kv_dtype)
    num_blocks = kv.num_kv_blocks or kv.kv_cache_memory // block_bytes
    configure_device(Device.DEFAULT, kernels)
    model = Transformer(cfg, weights, max_model_len, kernels=kernels, dtype=init.engine.model.dtype,
                        vocab_start=vocab_start, weight_pack=weight_pack(args, init, spec))
    del weights
    if init.engine.lora.enable_lora:
        model.serve_adapters(init.engine.lora.max_loras, init.engine.lora.max_lora_rank)
    cache = PagedKVCache(cfg, num_blocks, kv.block_size, kv_dtype)
    group = None
    if spec.tp_size > 1:  # the largest exchange: a bucket's residual stream, or its sampling rows' logits shard
        rows = min(batch.max_num_seqs, batch.max_num_batched_tokens)
        logits = rows * model.output.shape[0] if model.output is not None else 0
        max_bytes = 4 * max(batch.max_num_batched_tokens * cfg.dim, logits)
        from tinyvllm.workers.collective import HostGroup
        group = HostGroup(f"{init.group_id}-stage{spec.pp_rank}", spec.tp_rank, spec.tp_size, max_bytes)
    if link is not None and init.next_stage_address:
        link.connect_next(init.next_stage_address)
    draft_model = None
    if draft is not None:
        draft_model = make_draft_model(*draft, num_blocks, init, kernels, max_model_len)
        del draft  # its host copy of the weights
    captured_steps = None
    if spec.world_size == 1 and draft_model is None:  # a lone worker (the common case), also without warm-up
        from tinyvllm.workers.captured_steps import CapturedSteps
        captured_steps = CapturedSteps.for_model(model, cache, captured_steps_key(args, init, cfg, kernels, cache))
    sampling_masks = None
    if spec.samples:
        from tinyvllm.workers.sampling_masks import SamplingMasks, tokenizer_for_model
        sampling_masks = SamplingMasks(lambda: tokenizer_for_model(args.model, vocab_size))
    runner = ModelRunner(model, cache, batch.max_num_seqs, max_model_len, batch.max_num_batched_tokens, spec, group,
                         link, kv.swap_space, draft=draft_model, sampling_masks=sampling_masks,
                         captured_steps=captured_steps)
    if captured_steps is not None:
        from tinyvllm.workers.captured_steps import LoadedJit
        loaded = sum(isinstance(jit, LoadedJit) for jit in runner.forward_jits.values())
        log.info("worker%d: %d of %d captured steps from the disk cache", args.rank, loaded, len(runner.forward_jits))
    if own.kernels.jit_warmup and not warms_up_in_background(args):
        runner.warm_up(WarmupProgress(f"worker{args.rank}"))
        if runner.captured_steps is not None:
            runner.captured_steps.store_all()
        if group is not None:  # log_exchange_cost reports served steps, not the warm-up's waits for slower captures
            group.busy_s = 0.0
        if link is not None:
            link.transfer_s = 0.0
    return runner, n_kv_heads


def weight_pack(args: WorkerArgs, init, spec):
    """The model's weight packs, where --load-format uses them (workers/weight_pack.py)."""
    from tinyvllm.protocol.model_path import resolve_model_path
    from tinyvllm.workers.weight_pack import WeightPack, pack_directory, uses_pack
    path = resolve_model_path(args.model)
    if not uses_pack(init.engine.model.load_format, path):
        return None
    return WeightPack(pack_directory(), path, (spec.tp_rank, spec.tp_size, spec.pp_rank, spec.pp_size))


def captured_steps_key(args: WorkerArgs, init, cfg, kernels: str, cache) -> dict:
    """What a captured step depends on besides the software and machine (workers/captured_steps.py adds those)."""
    import dataclasses
    from tinyvllm.protocol.compatibility import model_fingerprint
    kv, batch = init.engine.cache, init.engine.batch
    return {"model": model_fingerprint(args.model), "config": dataclasses.asdict(cfg), "kernels": kernels,
            "beam": args.engine.kernels.beam, "sequences": batch.max_num_seqs,
            "context": init.engine.model.max_model_len,
            "tokens": batch.max_num_batched_tokens, "block_size": kv.block_size, "blocks": cache.num_blocks,
            "kv_dtype": cache.dtype, "dtype": init.engine.model.dtype,
            "lora": dataclasses.asdict(init.engine.lora) if init.engine.lora.enable_lora else None}


def warms_up_in_background(args: WorkerArgs) -> bool:
    """A lone mixed worker captures while idle (workers/background_warmup.py). Ranks of one model would stall each
    other's collectives, and a prefill or decode worker's KV transfers would wait behind a capture (a peer's pull
    times out): they capture before serving."""
    return args.world_size == 1 and args.role == "both" and not args.engine.kernels.warmup_before_serving


def idle_work(warmup: BackgroundWarmup | None, runner):
    """What to do while no message waits: the background warm-up's next capture, else writing the next step a
    served request captured to the disk (captured steps); None: nothing."""
    if warmup is not None and not warmup.done:
        return warmup.capture_next
    if runner is not None and runner.captured_steps is not None and runner.captured_steps.pending:
        return runner.captured_steps.store_next
    return None


def log_exchange_cost(rank: int, runner, steps: int) -> None:
    """What meeting the other workers cost per step: the tensor-parallel all-reduces (waiting for slower ranks
    included) and the pipeline's stage transfers (not the wait for the previous stage)."""
    if steps and (runner.group is not None or runner.link is not None):
        all_reduce = runner.group.busy_s if runner.group is not None else 0.0
        transfer = runner.link.transfer_s if runner.link is not None else 0.0
        log.info("rank %d: %d steps; per step %.2f ms in all-reduces, %.2f ms in stage transfers", rank, steps,
                 1e3 * all_reduce / steps, 1e3 * transfer / steps)


def run_worker(workers_endpoint: str, args: WorkerArgs, secret: str | None = None,
               started_by_launcher: bool = True) -> int:
    """Process entry point; returns the exit code. secret: shared with the scheduler (default:
    $TINYVLLM_WORKER_SECRET). A launcher's child dies with its parent; a standalone worker lives on its own and takes
    SIGTERM as Ctrl-C."""
    if started_by_launcher:
        exit_with_parent()
    else:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    codec.set_send_bound(args.engine.parallel.max_message_bytes)
    if cores := os.environ.get("TINYVLLM_CPU_CORES"):  # the launcher's share of this machine's cores
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker{args.rank} %(levelname)s %(message)s")
    from tinygrad import Context
    with Context(BEAM=args.engine.kernels.beam):
        return serve_steps(workers_endpoint, args, os.environ.get(SECRET_ENV, "") if secret is None else secret)


def serve_steps(workers_endpoint: str, args: WorkerArgs, secret: str) -> int:
    from tinygrad import Device
    from tinyvllm.workers.stage_link import StageLink
    ctx = zmq.Context()
    sock = connect_to_scheduler(ctx, workers_endpoint)
    link = None
    if args.pp_size > 1:  # a later stage listens for its input (by default on a free loopback port)
        link = StageLink(ctx, None if args.spec.first_stage else args.stage_address or "tcp://127.0.0.1:0")
    runner, steps, kv, warmup = None, 0, None, None
    try:
        hello = worker_hello(args, Device.DEFAULT, link.address if link is not None else "")
        watch = SchedulerWatch(sock)  # also while waiting for the other workers: a scheduler may die meanwhile
        msg = join_scheduler(sock, hello, secret, HELLO_ANSWER_TIMEOUT_S, watch.recv)
        if link is not None and secret:  # every stage input takes only what its previous stage sealed
            link.seal(stage_link_key(secret, msg.group_id, args.rank),
                      stage_link_key(secret, msg.group_id, args.rank + args.tp_size))
        while True:
            if isinstance(msg, InitWorker):
                runner, n_kv_heads = build_runner(args, msg, link)
                from tinyvllm.workers.worker_kv import WorkerKV
                kv = WorkerKV(ctx, args, runner, sock, n_kv_heads)
                if kv.side_channel is not None:
                    watch.serve_also(kv.side_channel.sock, kv.side_channel.handle)
                weight_bytes = runner.model.weight_nbytes + (runner.draft.runner.model.weight_nbytes
                                                             if runner.draft is not None else 0)  # a draft model's too
                log.info("rank %d (tp %d/%d, pp %d/%d): %.1f MB of weights, %d KV blocks", args.rank,
                         args.spec.tp_rank, args.tp_size, args.spec.pp_rank, args.pp_size, weight_bytes / 1e6,
                         runner.cache.num_blocks)
                send(sock, WorkerReady(args.rank, runner.cache.num_blocks, runner.cache.block_size,
                                       msg.engine.model.max_model_len, weight_bytes, kv.address,
                                       runner.host_swap.num_slots, *kv.disk_layout, runner.cache.dtype))
                forget_parsed_headers()  # the GGUF's vocabulary: only a structured-output request's masks read it
                if args.engine.kernels.jit_warmup and warms_up_in_background(args):
                    warmup = BackgroundWarmup(runner, args.rank)
            elif isinstance(msg, StepPlan):
                kv.before_step(msg)
                result = runner.execute(msg, args.rank)  # the plan's KV loads are for blocks it does not compute
                kv.load(msg, result)
                send_step_result(sock, result)
                steps += 1
            elif isinstance(msg, Shutdown):
                if runner is not None and runner.captured_steps is not None:  # e.g. LLM(...) exits after its steps
                    runner.captured_steps.store_all(within_s=STORE_AT_EXIT_S)
                break
            msg = None
            while (work := idle_work(warmup, runner)) is not None and (msg := watch.recv(timeout_ms=0)) is None:
                work()
            if msg is None:
                msg = watch.recv()
    except KeyboardInterrupt:
        pass
    except NoScheduler as e:
        log.error("rank %d: no scheduler to work for at %s: %s", args.rank, workers_endpoint, e)
        return REFUSED_EXIT_CODE if isinstance(e, WorkerRefusedError) else 1
    except Exception:
        log.exception("worker failed")
        send(sock, WorkerError(args.rank, traceback.format_exc(limit=5)))
        return 1
    finally:
        if runner is not None:
            log_exchange_cost(args.rank, runner, steps)
        if runner is not None and runner.group is not None:
            runner.group.close()
        if kv is not None:
            kv.close()
        ctx.destroy(linger=200)
    return 0

if __name__ == "__main__":  # started by frontend/engine/launcher.py as a program of its own
    from tinyvllm.protocol.child_process import child_args
    sys.exit(run_worker(*child_args(sys.argv, str, WorkerArgs)))
