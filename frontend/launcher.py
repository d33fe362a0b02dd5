"""Starts the engine's processes (one scheduler, tensor x pipeline-parallel workers), watches them, and stops them.

Used by both `tinyvllm serve` and the offline `LLM` API. Children are programs of their own
(protocol/child_process.py: never forked, so no tinygrad or ZMQ state is inherited, and never multiprocessing's
spawn, which re-runs the caller's script) and die with this process even if it is killed.
"""
import os
import pathlib
import shutil
from dataclasses import dataclass

from tinyvllm.protocol.child_process import ChildProcess
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.protocol.model_path import resolve_model_path
from tinyvllm.protocol.parallel_layout import check_parallel_sizes
from tinyvllm.protocol.transport import Endpoints
from tinyvllm.scheduler.main import SchedulerArgs

DEFAULT_KV_CACHE_BYTES = 1 << 30
CPU_KERNEL_SETS = ("c", "tinygrad")  # workers/kernel_set.py's KERNEL_SETS, named here without importing tinygrad


@dataclass(slots=True)
class EngineArgs:
    model: str | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    block_size: int = 16
    kv_cache_memory: int = DEFAULT_KV_CACHE_BYTES
    num_kv_blocks: int = 0  # overrides kv_cache_memory when set
    max_model_len: int | None = None  # default: the model's context length
    enable_prefix_caching: bool = True
    jit_warmup: bool = False  # capture every batch bucket's jitted step before serving (the CLI turns it on)
    beam: int = 0  # tinygrad BEAM search width for the workers' kernels (0: hand-coded heuristics)
    cpu_kernels: str | None = None  # the workers' kernel set, one of CPU_KERNEL_SETS (None: the device's default)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    transport: str = "ipc"
    tcp_base_port: int = 5555

    def validate(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "tensor_parallel_size",
                     "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.beam < 0:
            raise ValueError("--beam must be 0 (off) or a positive search width")
        if self.cpu_kernels not in (None, *CPU_KERNEL_SETS):
            raise ValueError(f"--cpu-kernels must be one of {', '.join(CPU_KERNEL_SETS)}")
        if self.num_kv_blocks < 0 or self.kv_cache_memory < 1:
            raise ValueError("the KV cache size must be positive")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


def device_placement(index: int, count: int, environ=os.environ) -> dict[str, str]:
    """Environment for worker `index` of `count` on this machine: device i of a GPU backend (DEV=CUDA -> CUDA:i),
    or on the CPU its share of the cores (tinygrad's thread count; the worker pins itself to them)."""
    dev = environ.get("DEV", "CPU")
    if dev.split(":")[0] != "CPU":
        return {"DEV": f"{dev.split(':')[0]}:{index}"} if count > 1 else {}
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    share = max(1, len(cores) // count)
    mine = [cores[(index * share + j) % len(cores)] for j in range(share)]
    return {"NUM_CPU_THREADS": str(share), "TINYVLLM_CPU_CORES": ",".join(map(str, mine))} if count > 1 else {}


class EngineProcesses:
    def __init__(self, args: EngineArgs):
        from tinyvllm.workers.main import WorkerArgs  # not at import: the HTTP process stays free of worker code

        args.validate()
        self.model_path = resolve_model_path(args.model)
        self.model_config = read_model_config(self.model_path)
        check_parallel_sizes(self.model_config, args.tensor_parallel_size, args.pipeline_parallel_size)
        self.max_model_len = min(args.max_model_len or self.model_config.max_context, self.model_config.max_context)
        if self.max_model_len < 2:
            raise ValueError("--max-model-len must be at least 2")
        self.endpoints = Endpoints.ipc() if args.transport == "ipc" else Endpoints.tcp(base_port=args.tcp_base_port)
        sched_args = SchedulerArgs(args.world_size, args.block_size, args.max_num_seqs, args.max_num_batched_tokens,
                                   self.max_model_len, args.num_kv_blocks, args.kv_cache_memory, args.enable_prefix_caching)
        self.processes = [ChildProcess("tinyvllm-scheduler", "tinyvllm.scheduler.main", self.endpoints, sched_args)]
        tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
        worker_args = [WorkerArgs(str(self.model_path), rank, args.world_size, jit_warmup=args.jit_warmup, beam=args.beam,
                                  kernels=args.cpu_kernels, tp_size=tp, pp_size=pp,
                                  stage_address=self.endpoints.stage_input(rank) if rank >= tp else "")
                       for rank in range(args.world_size)]
        self.processes += [ChildProcess(f"tinyvllm-worker{a.rank}", "tinyvllm.workers.main", self.endpoints.workers, a,
                                        env=device_placement(a.rank, args.world_size))
                           for a in worker_args]

    def start(self) -> None:
        for p in self.processes:
            p.start()

    def dead_process(self) -> str | None:
        """A description of the first child that exited, or None while all run."""
        for p in self.processes:
            if p.exitcode is not None:
                return f"{p.name} exited with code {p.exitcode}"
        return None

    def stop(self, timeout_s: float = 5.0) -> None:
        for p in self.processes:
            if p.pid is not None:
                p.join(timeout_s)
        for p in self.processes:
            if p.is_alive():
                p.terminate()
                p.join(2)
            if p.is_alive():
                p.kill()
                p.join()
        if self.endpoints.scheduler_input.startswith("ipc://"):
            shutil.rmtree(pathlib.Path(self.endpoints.scheduler_input[6:]).parent, ignore_errors=True)
