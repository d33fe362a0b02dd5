"""The scheduler process: owns the request queue and the KV block manager, drives the workers step by step.

Sockets: PULL from the frontend (AddRequest, AbortRequests, Shutdown), PUSH to the frontend (EngineReady,
StepOutputs), ROUTER to the workers (hello/init/ready handshake, StepPlan out, StepResult back).
"""
import logging
import os
import sys
import time
import uuid
from collections import deque
from dataclasses import replace

import zmq

from tinyvllm.protocol import codec
from tinyvllm.protocol.codec import CodecError
from tinyvllm.protocol.kv_auth import KV_SECRET_ENV
from tinyvllm.protocol.kv_release import release_remote_kv
from tinyvllm.protocol.message_parts import merge_step_results
from tinyvllm.protocol.messages import (AbortRequests, AddRequest, EngineReady, KVReleased, KVTransferParams, Shutdown,
                                        StepPlan, StepResult, WorkerError)
from tinyvllm.protocol.transport import Endpoints, make_socket, recv, send
from tinyvllm.protocol.process_args import SchedulerArgs
from tinyvllm.scheduler.request import Request
from tinyvllm.scheduler.config import SchedulerConfig
from tinyvllm.scheduler.disk_kv import scan_disk_dir
from tinyvllm.scheduler.kv_events import KVEventPublisher
from tinyvllm.scheduler.output_messages import send_step_outputs
from tinyvllm.scheduler.scheduler import Scheduler
from tinyvllm.scheduler.worker_group import WorkerGroup
from tinyvllm.protocol.process_guard import exit_with_parent

log = logging.getLogger("tinyvllm.scheduler")


def scheduler_config(a: SchedulerArgs, num_blocks: int, num_swap_slots: int = 0) -> SchedulerConfig:
    e = a.engine
    return SchedulerConfig(e.batch.max_num_seqs, e.batch.max_num_batched_tokens, e.model.max_model_len,
                           e.cache.block_size, num_blocks, e.cache.enable_prefix_caching, e.max_steps_in_flight,
                           e.runs_async, e.kv_transfer.kv_lease_s, e.world_size, num_swap_slots=num_swap_slots,
                           sliding_window=a.sliding_window, speculative=e.speculative_config,
                           max_loras=e.lora.max_loras if e.lora.enable_lora else 0)


class SchedulerLoop:
    def __init__(self, endpoints: Endpoints, args: SchedulerArgs):
        self.ctx = zmq.Context()
        self.from_frontend = make_socket(self.ctx, zmq.PULL, endpoints.scheduler_input, bind=True)
        self.to_frontend = make_socket(self.ctx, zmq.PUSH, endpoints.frontend_output, bind=False)
        self.workers = WorkerGroup(make_socket(self.ctx, zmq.ROUTER, endpoints.workers, bind=True))
        self.args = args
        self.kv_secret = os.environ.get(KV_SECRET_ENV, "")  # the launcher's --kv-secret
        self.scheduler: Scheduler | None = None
        self.kv_events: KVEventPublisher | None = None
        self.running = True

    def start(self) -> None:
        num_blocks = self.workers.handshake(self.args)
        a = self.args
        e = a.engine
        if (pool_tokens := num_blocks * e.cache.block_size) < e.model.max_model_len and not a.sliding_window:
            # one request must fit the whole pool (unless it only ever holds its window): longer prompts are then
            # refused up front with the usual 400
            log.warning("the KV cache holds %d tokens (%d blocks of %d), fewer than max_model_len %d: serving "
                        "max_model_len %d (give the cache more memory with --kv-cache-memory)", pool_tokens,
                        num_blocks, e.cache.block_size, e.model.max_model_len, pool_tokens)
            a = self.args = replace(a, engine=e.serving(pool_tokens))
            e = a.engine
        self.scheduler = Scheduler(scheduler_config(a, num_blocks, self.workers.num_swap_slots))
        self.scheduler.remote_kv.takes_remote_prefill = e.kv_transfer.role == "decode"
        if kv_address := self.workers.kv_addresses.get(0):  # a prefill engine: its workers serve their blocks
            port = int(kv_address.rsplit(":", 1)[1])
            self.scheduler.remote_kv.side_channel = KVTransferParams(
                remote_engine_id=f"tinyvllm-{uuid.uuid4().hex[:12]}", remote_host=e.kv_transfer.kv_host,
                remote_port=port, tp_size=e.parallel.tensor_parallel_size)
            log.info("KV side channel at %s:%d, leases of %.0f s", e.kv_transfer.kv_host, port,
                     e.kv_transfer.kv_lease_s)
        if (events := e.cache.kv_events_config) is not None:  # the config refuses events without prefix caching
            self.kv_events = KVEventPublisher(self.ctx, events, a.data_parallel_rank)
            self.scheduler.kv_cache_manager.pool.events = []
        if self.workers.kv_disk_dirs:  # every rank has its files in the same folder, named by rank
            self.open_disk_cache(self.workers.kv_disk_dirs[0])
        send(self.to_frontend, EngineReady(num_blocks, e.cache.block_size, e.model.max_model_len, e.batch.max_num_seqs,
                                           e.world_size, [self.workers.weight_bytes[r] for r in range(e.world_size)],
                                           self.workers.kv_cache_dtype, self.workers.device))
        log.info("scheduler ready: %d KV blocks of %d tokens, %d swap slots, up to %d steps in flight%s", num_blocks,
                 e.cache.block_size, self.workers.num_swap_slots, e.max_steps_in_flight,
                 ", async scheduling" if self.scheduler.config.async_scheduling else "")

    def open_disk_cache(self, folder: str) -> None:
        e, disk = self.args.engine, self.scheduler.disk_kv
        disk.open(scan_disk_dir(folder, e.world_size), e.cache.kv_cache_dir_bytes, self.workers.kv_disk_block_bytes)
        log.info("persistent prefix cache in %s: %d blocks (%.1f MB) found, up to %.1f MB", folder, len(disk.index),
                 disk.num_bytes / 1e6, e.cache.kv_cache_dir_bytes / 1e6)

    def handle_frontend(self, msg) -> None:
        if isinstance(msg, AddRequest):
            self.scheduler.add_request(Request.from_add_request(msg))
        elif isinstance(msg, AbortRequests):
            self.scheduler.abort(msg.req_ids)
        elif isinstance(msg, Shutdown):
            self.running = False

    def drain_frontend(self, timeout_ms: int) -> bool:
        """Handles every frontend message that is waiting (waiting up to timeout_ms for the first); meanwhile takes
        the workers' KVReleased (a prefill engine between steps)."""
        if timeout_ms and self.scheduler.remote_kv.side_channel is not None:
            poller = zmq.Poller()
            poller.register(self.from_frontend, zmq.POLLIN)
            poller.register(self.workers.sock, zmq.POLLIN)
            if self.workers.sock in dict(poller.poll(timeout_ms)):
                self.recv_from_workers()
                return True
            timeout_ms = 0
        got = False
        while self.from_frontend.poll(timeout_ms):
            try:
                self.handle_frontend(recv(self.from_frontend))
            except CodecError as e:
                log.warning("dropped a malformed message: %s", e)
            got, timeout_ms = True, 0
        return got

    def recv_from_workers(self):
        """The next worker message; a WorkerError raises, a KVReleased (a prefill engine) is applied here."""
        _, msg = self.workers.recv(time.monotonic() + 1)
        if isinstance(msg, WorkerError):
            raise RuntimeError(f"worker {msg.rank} failed: {msg.message}")
        if isinstance(msg, KVReleased):
            self.scheduler.remote_kv.release(msg.req_ids, msg.rank)
        return msg

    def finish_step(self, plan: StepPlan) -> tuple[list, list]:
        """Waits for the result of `plan`, the oldest plan sent, from the rank that samples (workers.output_rank;
        the others' are ignored; a result in several parts is merged) and applies it: its outputs, and the frontend
        messages that arrived meanwhile, for the caller to apply once it has reported the step.
        A Shutdown while waiting (say, because a worker died and will never answer) ends the wait."""
        poller = zmq.Poller()
        poller.register(self.workers.sock, zmq.POLLIN)
        poller.register(self.from_frontend, zmq.POLLIN)
        pending, parts = [], []
        while True:
            events = dict(poller.poll(1000))
            if self.workers.sock in events:
                msg = self.recv_from_workers()
                if isinstance(msg, StepResult) and msg.step_id == plan.step_id and msg.rank == self.workers.output_rank:
                    parts.append(msg)
                    if not msg.more_parts:
                        break
            if self.from_frontend in events:
                try:
                    incoming = recv(self.from_frontend)
                except CodecError as e:
                    log.warning("dropped a malformed message: %s", e)
                    continue
                if isinstance(incoming, Shutdown):
                    self.running = False
                    return [], []
                pending.append(incoming)
        return self.scheduler.update_from_output(plan, merge_step_results(parts)), pending

    def loop(self) -> None:
        """Keeps up to max_steps_in_flight plans sent (workers run them in order), then waits for the oldest."""
        sched = self.scheduler
        sent: deque[StepPlan] = deque()
        stepped, arrived = False, []
        while self.running:
            # nothing planned last time (say, requests that wait for leased blocks): wait for news, do not spin;
            # messages applied after the last step (an abort's output, say) go out first
            changed = self.drain_frontend(0 if (sched.has_unfinished() and stepped) or sent or arrived else 100)
            changed |= sched.remote_kv.expire_leases()  # the stats must say so, also when nothing else happens
            outputs = sched.take_pending_outputs()
            while self.running and len(sent) < sched.config.max_steps_in_flight:
                if (plan := sched.schedule()) is None:
                    break
                self.workers.broadcast(plan)
                sent.append(plan)
                changed |= bool(plan.new_reqs)  # requests that start running: from the queue, or just arrived
            if sent and (outputs or changed):
                # Report now, not after the step: it may take long (a bucket's first jit capture, a loaded machine),
                # and until then the frontend (dashboard, /metrics, the replica router) would not see the requests
                # just taken on, nor the aborts and rejections.
                send_step_outputs(self.to_frontend, sched, outputs)
                outputs, changed = [], False
            stepped, arrived = bool(sent), []
            if stepped:
                step_outputs, arrived = self.finish_step(sent.popleft())
                outputs += step_outputs + sched.take_pending_outputs()
            if outputs or changed or stepped:
                send_step_outputs(self.to_frontend, sched, outputs)
            # Requests that arrived during the step are taken on after its report: reported now, they would show as
            # waiting until the next plan, and the replica router weighs a waiting request as four running ones.
            for incoming in arrived:
                self.handle_frontend(incoming)
            self.publish_kv_events()
            for remote in sched.remote_kv.take_abandoned():
                try:
                    release_remote_kv(self.ctx, remote, self.kv_secret)
                except Exception as e:  # a host ZMQ cannot parse, say: the lease runs out on its own
                    log.warning("could not release the remote KV of %s: %r", remote.remote_request_id, e)

    def publish_kv_events(self) -> None:
        """The block pool's stores and evictions since the last pass, as one batch (KV events on)."""
        pool = self.scheduler.kv_cache_manager.pool
        if self.kv_events is not None and pool.events:
            self.kv_events.publish(pool.events)
            pool.events = []

    def close(self) -> None:
        try:
            if self.kv_events is not None:
                self.kv_events.close()
        finally:
            self.workers.broadcast(Shutdown("scheduler stopping"), skip_gone=True)
            self.ctx.destroy(linger=100)


def run_scheduler(endpoints: Endpoints, args: SchedulerArgs) -> None:
    """Process entry point."""
    exit_with_parent()
    codec.set_send_bound(args.engine.parallel.max_message_bytes)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s scheduler %(levelname)s %(message)s")
    loop = SchedulerLoop(endpoints, args)
    try:
        loop.start()
        loop.loop()
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()


if __name__ == "__main__":  # started by frontend/engine/launcher.py as a program of its own
    from tinyvllm.protocol.child_process import child_args
    run_scheduler(*child_args(sys.argv, Endpoints, SchedulerArgs))
