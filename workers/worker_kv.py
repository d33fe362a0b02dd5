"""A worker's KV side features: in disaggregated prefill/decode, a prefill worker serves its KV blocks on the side channel
between steps and tells its scheduler when a decode worker is done with a request's blocks, and any worker performs a
plan's kv_loads (pulls remote blocks into its own) after the step (workers/kv_side_channel.py has the wire protocol);
with --kv-cache-dir, it saves and loads the plan's blocks to and from disk (workers/kv_disk_store.py)."""
import logging
import os

import numpy as np
import zmq

from tinyvllm.protocol.compatibility import model_fingerprint
from tinyvllm.protocol.kv_auth import KV_SECRET_ENV
from tinyvllm.protocol.kv_compat import kv_compat_fields, kv_compat_hash
from tinyvllm.protocol.messages import KVReleased, StepPlan, StepResult
from tinyvllm.protocol.transport import send
from tinyvllm.workers.kv_block_io import KVBlockIO
from tinyvllm.workers.kv_disk_file import BlockFileKey
from tinyvllm.workers.kv_disk_store import KVDiskStore
from tinyvllm.workers.kv_pull import KVPullError, pull_blocks, pull_deadline
from tinyvllm.workers.kv_side_channel import KVSideChannel

log = logging.getLogger("tinyvllm.worker")


class WorkerKV:
    def __init__(self, ctx: zmq.Context, args, runner, scheduler_sock: zmq.Socket, n_kv_heads: int):
        """args: WorkerArgs (a prefill worker has kv_address: where its side channel binds); n_kv_heads: the
        model's (this rank's cache holds some of them)."""
        self.ctx, self.rank, self.group = ctx, args.rank, runner.group
        self.tp_rank, self.tp_size, self.n_kv_heads = args.spec.tp_rank, args.spec.tp_size, n_kv_heads
        self.scheduler_sock = scheduler_sock
        cache = runner.cache
        self.compat_hash = kv_compat_hash(kv_compat_fields(
            model_fingerprint(args.model), cache.dtype, cache.block_size, len(cache.layers), n_kv_heads,
            cache.layers[0].shape[3]))
        self.block_io: KVBlockIO = runner.block_io
        self.secret = os.environ.get(KV_SECRET_ENV, "")  # the launcher's --kv-secret
        self.side_channel = None
        if args.kv_address:
            self.side_channel = KVSideChannel(ctx, args.kv_address, self.block_io, self.compat_hash, self._released,
                                              self.secret)
            log.info("rank %d: KV side channel at %s", args.rank, self.side_channel.address)
        self.disk = None
        if args.engine.cache.kv_cache_dir:
            key = BlockFileKey(self.compat_hash, args.rank, args.spec.tp_size, args.spec.pp_size)
            self.disk = KVDiskStore(args.engine.cache.kv_cache_dir, key, self.block_io, self.group)
            log.info("rank %d: persistent prefix cache in %s", args.rank, self.disk.dir)

    @property
    def address(self) -> str:
        return self.side_channel.address if self.side_channel is not None else ""

    @property
    def disk_layout(self) -> tuple[str, int]:
        """(the persistent prefix cache's folder, one block file's bytes), for WorkerReady; ("", 0) without one."""
        return (self.disk.dir, self.disk.file_bytes) if self.disk is not None else ("", 0)

    def _released(self, request_id: str) -> None:
        send(self.scheduler_sock, KVReleased(self.rank, [request_id]))

    def before_step(self, plan: StepPlan) -> None:
        """Saves the plan's blocks to disk (the step may reuse them), and updates what the side channel may serve (the
        blocks this step completes a prompt in are not read before the step ran: the channel is served between
        steps)."""
        if self.disk is not None:
            self.disk.save(plan)
        if self.side_channel is not None:
            for req_id in plan.kv_leases_ended:
                self.side_channel.end_lease(req_id)
            self.side_channel.leases.update((lease.req_id, (lease.block_ids, lease.tokens_hash))
                                            for lease in plan.kv_leases)

    def load(self, plan: StepPlan, result: StepResult) -> None:
        """Fills the plan's kv_disk_loads from disk, and pulls each of plan.kv_loads (all within one deadline); records
        in result which arrived and which failed (and why). Tensor-parallel ranks agree first: a load that failed on
        any rank fails on all (the scheduler reads the sampling rank's result, and no rank may decode on a hole)."""
        if self.disk is not None:
            self.disk.load(plan, result)
        if not plan.kv_loads:
            return
        deadline = pull_deadline()
        failed: dict[str, str] = {}
        for load in plan.kv_loads:
            try:
                pull_blocks(self.ctx, load, self.block_io, self.compat_hash, self.n_kv_heads, self.tp_rank,
                            self.tp_size, deadline, self.secret)
            except KVPullError as e:
                log.warning("rank %d: request %s: %s", self.rank, load.req_id, e)
                failed[load.req_id] = str(e)
        if self.group is not None:
            flags = np.array([load.req_id in failed for load in plan.kv_loads], np.float32)
            anywhere = self.group.all_reduce(flags)
            for load, count in zip(plan.kv_loads, anywhere):
                if count and load.req_id not in failed:
                    failed[load.req_id] = "another tensor-parallel rank could not pull its KV heads (see its log)"
        for load in plan.kv_loads:
            if load.req_id in failed:
                result.kv_failed_req_ids.append(load.req_id)
                result.kv_failed_reasons.append(failed[load.req_id])
            else:
                result.kv_loaded_req_ids.append(load.req_id)

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()
        if self.side_channel is not None:
            self.side_channel.close()
