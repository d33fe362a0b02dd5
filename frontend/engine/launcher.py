"""Starts the engine's processes (one scheduler, tensor x pipeline-parallel workers), watches them, and stops them.
With external workers it starts only the scheduler, whose worker socket then waits for `tinyvllm worker`s.

Used by both `tinyvllm serve` and the offline `LLM` API. Children are programs of their own
(protocol/child_process.py: never forked, so no tinygrad or ZMQ state is inherited, and never multiprocessing's
spawn, which re-runs the caller's script) and die with this process even if it is killed.
"""
import dataclasses
import logging
import pathlib
import secrets
import shutil

from tinyvllm.protocol.child_process import ChildProcess
from tinyvllm.protocol.compatibility import model_fingerprint
from tinyvllm.protocol.device_placement import device_placement
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.kv_auth import KV_SECRET_ENV
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.protocol.model_path import resolve_model_path
from tinyvllm.protocol.parallel_layout import check_parallel_sizes
from tinyvllm.protocol.process_args import SchedulerArgs, WorkerArgs
from tinyvllm.protocol.speculative_config import resolve_draft_model
from tinyvllm.protocol.transport import Endpoints
from tinyvllm.protocol.worker_auth import SECRET_ENV

log = logging.getLogger("tinyvllm.frontend")


class EngineProcesses:
    def __init__(self, config: EngineConfig, replica: int = 0):
        """replica: which data-parallel engine this is; its workers take the devices (or cores) after those of the
        replicas before it, and with tcp its ports come after theirs."""
        config.validate()
        self.model_path = resolve_model_path(config.model.model)
        self.model_config = read_model_config(self.model_path)
        parallel, cache = config.parallel, config.cache
        check_parallel_sizes(self.model_config, parallel.tensor_parallel_size, parallel.pipeline_parallel_size)
        if cache.kv_cache_dir and self.model_config.sliding_window_everywhere:  # its hits would skip blocks behind
            raise ValueError("--kv-cache-dir is not supported yet for models whose every layer has a sliding window")
        self.max_model_len = min(config.model.max_model_len or self.model_config.max_context,
                                 self.model_config.max_context)
        if self.max_model_len < 2:
            raise ValueError("--max-model-len must be at least 2")
        speculative = config.speculative_config
        if speculative is not None and speculative.method == "draft_model":
            speculative = resolve_draft_model(speculative, self.model_config)
        # what the other processes see: the model's path resolved, no secrets (those go in the environment)
        self.config = dataclasses.replace(config.public(), speculative_config=speculative, model=dataclasses.replace(
            config.model, model=str(self.model_path), max_model_len=self.max_model_len))
        world_size = config.world_size
        ports_per_replica = 3 + world_size  # three endpoints, then one stage input per rank at most
        self.endpoints = Endpoints.ipc() if parallel.transport == "ipc" else \
            Endpoints.tcp(base_port=parallel.tcp_base_port + replica * ports_per_replica)
        if parallel.external_workers:
            self.endpoints = dataclasses.replace(self.endpoints, workers=parallel.worker_address)
        sched_args = SchedulerArgs(self.config, self.model_config.n_layers,
                                   model_fingerprint(self.model_path), self.model_config.sliding_window_everywhere,
                                   data_parallel_rank=replica)
        # tcp on loopback is open to every local user: the launcher's workers then prove a secret of its own
        secret = parallel.worker_secret or (secrets.token_hex(32) if parallel.transport == "tcp"
                                            and not parallel.external_workers else "")
        secret_env = {SECRET_ENV: secret} if secret else {}  # never on a command line
        if config.kv_transfer.kv_secret:
            secret_env[KV_SECRET_ENV] = config.kv_transfer.kv_secret
        self.processes = [ChildProcess("tinyvllm-scheduler", "tinyvllm.scheduler.main", self.endpoints, sched_args,
                                       env=secret_env)]
        self.external_workers = world_size if parallel.external_workers else 0
        if parallel.external_workers:
            return
        tp = parallel.tensor_parallel_size
        worker_args = [WorkerArgs(self.config, rank, self.endpoints.stage_input(rank) if rank >= tp else "",
                                  self.kv_address(config, replica, rank))
                       for rank in range(world_size)]
        self.processes += [ChildProcess(f"tinyvllm-worker{a.rank}", "tinyvllm.workers.main", self.endpoints.workers, a,
                                        env={**device_placement(replica * world_size + a.rank,
                                                                parallel.data_parallel_size * world_size),
                                             **secret_env})
                           for a in worker_args]

    @staticmethod
    def kv_address(config: EngineConfig, replica: int, rank: int) -> str:
        """Where a prefill worker binds its KV side channel (others have none)."""
        kv = config.kv_transfer
        if kv.role != "prefill":
            return ""
        return f"tcp://{kv.kv_host}:{kv.kv_port + replica * config.world_size + rank if kv.kv_port else 0}"

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
