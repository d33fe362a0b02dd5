"""Starts the engine's processes (one scheduler, tensor x pipeline-parallel workers), watches them, and stops them.
With external workers it starts only the scheduler, whose worker socket then waits for `tinyvllm worker`s.

Used by both `tinyvllm serve` and the offline `LLM` API. Children are programs of their own
(protocol/child_process.py: never forked, so no tinygrad or ZMQ state is inherited, and never multiprocessing's
spawn, which re-runs the caller's script) and die with this process even if it is killed.
"""
import dataclasses
import json
import logging
import os
import pathlib
import secrets
import shutil
from dataclasses import dataclass, field

from tinyvllm.protocol.child_process import ChildProcess
from tinyvllm.protocol.compatibility import model_fingerprint
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.protocol.model_path import resolve_model_path
from tinyvllm.protocol.parallel_layout import check_parallel_sizes
from tinyvllm.protocol.transport import Endpoints
from tinyvllm.protocol.kv_auth import KV_SECRET_ENV, require_kv_secret_beyond_loopback
from tinyvllm.protocol.kv_cache_dtype import check_kv_cache_dtype
from tinyvllm.protocol.speculative_config import parse_speculative_config, resolve_draft_model
from tinyvllm.protocol.worker_auth import SECRET_ENV, require_secret_beyond_loopback
from tinyvllm.scheduler.main import SchedulerArgs

log = logging.getLogger("tinyvllm.frontend")

DEFAULT_KV_CACHE_BYTES = 1 << 30
DEFAULT_KV_CACHE_DIR_BYTES = 4 << 30
WORKER_ROLES = {"both": "mixed", "prefill": "prefill", "decode": "decode"}  # protocol.messages.WorkerRole
CPU_KERNEL_SETS = ("c", "c-int8", "tinygrad")  # workers/kernel_set.py's KERNEL_SETS, named here without importing tinygrad


@dataclass(slots=True)
class EngineArgs:
    model: str | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    block_size: int = 16
    kv_cache_memory: int = DEFAULT_KV_CACHE_BYTES
    num_kv_blocks: int = 0  # overrides kv_cache_memory when set
    swap_space: int = 0  # bytes of host memory per worker for preempted requests' KV blocks (scheduler/swap.py)
    kv_cache_dtype: str = "auto"  # protocol/kv_cache_dtype.py
    max_model_len: int | None = None  # default: the model's context length
    enable_prefix_caching: bool = True
    jit_warmup: bool = False  # capture every batch bucket's jitted step (the CLI turns it on; background_warmup.py)
    warmup_before_serving: bool = False  # ... before serving, also for a lone worker
    beam: int = 0  # tinygrad BEAM search width for the workers' kernels (0: hand-coded heuristics)
    cpu_kernels: str | None = None  # the workers' kernel set, one of CPU_KERNEL_SETS (None: the device's default)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    transport: str = "ipc"
    tcp_base_port: int = 5555
    external_workers: bool = False  # start no workers: wait for `tinyvllm worker`s at worker_address
    worker_address: str | None = None  # where the scheduler's worker socket binds (with external_workers)
    worker_secret: str = field(default="", repr=False)  # shared with the workers (protocol/worker_auth.py)
    data_parallel_size: int = 1  # independent engines (replicas), each a scheduler and its world_size workers
    # An engine that owes outputs and finishes no step for this long is hung: its group is restarted. Long enough
    # for a step that first captures a large bucket's jit on a slow CPU.
    step_timeout_s: float = 120.0
    # Plan each step while the one before runs (vLLM's --async-scheduling); only with one worker (world size 1).
    async_scheduling: bool = True
    # Disaggregated prefill/decode (docs/ARCHITECTURE.md): a prefill engine's workers serve their KV blocks on a side
    # channel at kv_host:kv_port (+ rank; 0: a free port each), leased for kv_lease_s after each prompt.
    role: str = "both"
    kv_host: str = "127.0.0.1"
    kv_port: int = 0
    kv_lease_s: float = 30.0
    kv_secret: str = field(default="", repr=False)  # shared by every prefill and decode instance (protocol/kv_auth.py)
    # The persistent prefix cache (scheduler/disk_kv.py): full blocks of cached prefixes kept in this folder, up to
    # kv_cache_dir_bytes (least recently used files go first), and loaded after a restart.
    kv_cache_dir: str | None = None
    kv_cache_dir_bytes: int = DEFAULT_KV_CACHE_DIR_BYTES
    # Speculative decoding (scheduler/spec_decode.py): vLLM's SpeculativeConfig as JSON (or a dict); None: off.
    speculative_config: str | dict | None = None

    def validate(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "tensor_parallel_size",
                     "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.step_timeout_s <= 0:
            raise ValueError("--step-timeout must be positive")
        if self.external_workers and self.data_parallel_size > 1:
            raise ValueError("--external-workers serves one engine: --data-parallel-size must be 1")
        if self.beam < 0:
            raise ValueError("--beam must be 0 (off) or a positive search width")
        if self.cpu_kernels not in (None, *CPU_KERNEL_SETS):
            raise ValueError(f"--cpu-kernels must be one of {', '.join(CPU_KERNEL_SETS)}")
        if self.num_kv_blocks < 0 or self.kv_cache_memory < 1:
            raise ValueError("the KV cache size must be positive")
        if self.swap_space < 0:
            raise ValueError("--swap-space must be 0 (off) or positive")
        check_kv_cache_dtype(self.kv_cache_dtype)
        if self.external_workers != bool(self.worker_address):
            raise ValueError("--external-workers and --worker-address go together: the workers connect to that "
                             "address (e.g. --worker-address tcp://0.0.0.0:7000)")
        if self.worker_address and not self.worker_address.startswith(("tcp://", "ipc://")):
            raise ValueError(f"--worker-address must be tcp://HOST:PORT or ipc://PATH, not {self.worker_address!r}")
        require_secret_beyond_loopback(self.worker_secret, worker_address=self.worker_address or "")
        if self.role not in ("both", "prefill", "decode"):
            raise ValueError(f"--role must be both, prefill or decode, not {self.role!r}")
        if self.role != "both" and self.pipeline_parallel_size > 1:
            raise ValueError("--role prefill|decode needs --pipeline-parallel-size 1 (for now)")
        if self.role == "prefill" and self.kv_port == 0 and self.world_size * self.data_parallel_size > 1:
            raise ValueError("--role prefill with several workers needs --kv-port (rank r serves at kv-port + r)")
        if self.kv_cache_dir and (self.pipeline_parallel_size > 1 or not self.enable_prefix_caching):
            raise ValueError("--kv-cache-dir needs prefix caching and --pipeline-parallel-size 1 (for now)")
        if self.kv_cache_dir_bytes < 1:
            raise ValueError("--kv-cache-dir-size must be positive")
        if self.kv_lease_s <= 0:
            raise ValueError("--kv-lease-seconds must be positive")
        speculative = parse_speculative_config(self.speculative_config)
        if speculative is not None and self.world_size > 1:
            raise ValueError("--speculative-config needs one worker (tensor- and pipeline-parallel size 1) for now")
        if speculative is not None and speculative.method == "draft_model" and self.role == "decode":
            # the prompt's KV arrives from the prefill instance for the target only: the draft would guess blind
            raise ValueError("a draft model needs the prompt's KV in its own cache, which a decode instance does not "
                             "get: use the ngram method with --role decode")
        if self.role == "prefill":
            require_kv_secret_beyond_loopback(self.kv_secret, self.kv_host)
            if self.external_workers:
                raise ValueError("--role prefill starts its own workers (their KV side channel): not with "
                                 "--external-workers")
            if self.kv_host in ("0.0.0.0", "::", ""):
                raise ValueError(f"--kv-host {self.kv_host!r} is not an address: give the one decode instances reach "
                                 f"(it is what they are told to pull from)")

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
    def __init__(self, args: EngineArgs, replica: int = 0):
        """replica: which data-parallel engine this is; its workers take the devices (or cores) after those of the
        replicas before it, and with tcp its ports come after theirs."""
        from tinyvllm.workers.main import WorkerArgs  # not at import: the HTTP process stays free of worker code

        args.validate()
        self.model_path = resolve_model_path(args.model)
        self.model_config = read_model_config(self.model_path)
        check_parallel_sizes(self.model_config, args.tensor_parallel_size, args.pipeline_parallel_size)
        if args.kv_cache_dir and self.model_config.sliding_window_everywhere:  # its hits would skip blocks behind
            raise ValueError("--kv-cache-dir is not supported yet for models whose every layer has a sliding window")
        self.max_model_len = min(args.max_model_len or self.model_config.max_context, self.model_config.max_context)
        if self.max_model_len < 2:
            raise ValueError("--max-model-len must be at least 2")
        speculative = parse_speculative_config(args.speculative_config)  # drafts are planned between steps: no async
        if speculative is not None and speculative.method == "draft_model":
            speculative = resolve_draft_model(speculative, self.model_config)
        ports_per_replica = 3 + args.world_size  # three endpoints, then one stage input per rank at most
        self.endpoints = Endpoints.ipc() if args.transport == "ipc" else \
            Endpoints.tcp(base_port=args.tcp_base_port + replica * ports_per_replica)
        if args.external_workers:
            self.endpoints = dataclasses.replace(self.endpoints, workers=args.worker_address)
        tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
        async_scheduling = args.async_scheduling and args.world_size == 1 and speculative is None
        sched_args = SchedulerArgs(args.world_size, args.block_size, args.max_num_seqs, args.max_num_batched_tokens,
                                   self.max_model_len, args.num_kv_blocks, args.kv_cache_memory, args.enable_prefix_caching,
                                   tp_size=tp, pp_size=pp, n_layers=self.model_config.n_layers,
                                   model_fingerprint=model_fingerprint(self.model_path),
                                   # each pipeline stage busy with its own step; or the next step planned meanwhile
                                   max_steps_in_flight=2 if async_scheduling else pp,
                                   async_scheduling=async_scheduling, kv_lease_s=args.kv_lease_s,
                                   kv_host=args.kv_host, role=args.role, swap_space_bytes=args.swap_space,
                                   kv_cache_dir_bytes=args.kv_cache_dir_bytes, kv_cache_dtype=args.kv_cache_dtype,
                                   sliding_window=self.model_config.sliding_window_everywhere,
                                   speculative_config=json.dumps(dataclasses.asdict(speculative)) if speculative else "")
        # tcp on loopback is open to every local user: the launcher's workers then prove a secret of its own
        secret = args.worker_secret or (secrets.token_hex(32) if args.transport == "tcp" and not args.external_workers
                                        else "")
        secret_env = {SECRET_ENV: secret} if secret else {}  # never on a command line
        if args.kv_secret:
            secret_env[KV_SECRET_ENV] = args.kv_secret
        self.processes = [ChildProcess("tinyvllm-scheduler", "tinyvllm.scheduler.main", self.endpoints, sched_args,
                                       env=secret_env)]
        self.external_workers = args.world_size if args.external_workers else 0
        if args.external_workers:
            return
        worker_args = [WorkerArgs(str(self.model_path), rank, args.world_size, jit_warmup=args.jit_warmup,
                                  warmup_before_serving=args.warmup_before_serving, beam=args.beam,
                                  kernels=args.cpu_kernels, tp_size=tp, pp_size=pp,
                                  stage_address=self.endpoints.stage_input(rank) if rank >= tp else "",
                                  role=WORKER_ROLES[args.role], kv_address=self.kv_address(args, replica, rank),
                                  kv_cache_dir=args.kv_cache_dir or "")
                       for rank in range(args.world_size)]
        self.processes += [ChildProcess(f"tinyvllm-worker{a.rank}", "tinyvllm.workers.main", self.endpoints.workers, a,
                                        env={**device_placement(replica * args.world_size + a.rank,
                                                                args.data_parallel_size * args.world_size),
                                             **secret_env})
                           for a in worker_args]

    @staticmethod
    def kv_address(args: EngineArgs, replica: int, rank: int) -> str:
        """Where a prefill worker binds its KV side channel (others have none)."""
        if args.role != "prefill":
            return ""
        return f"tcp://{args.kv_host}:{args.kv_port + replica * args.world_size + rank if args.kv_port else 0}"

    def start(self) -> None:
        for p in self.processes:
            p.start()
        if self.external_workers:
            log.info("waiting for %d workers: start each with `tinyvllm worker --connect %s --rank R ...` "
                     "(docs/DEPLOY.md)", self.external_workers, self.endpoints.workers)

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
