"""The scheduler's side of its workers: the start-up handshake, then every plan to every worker.

Each worker says hello and is admitted or refused (scheduler/worker_admission.py: the shared secret, the version,
the model, its rank and layers); once all `world_size` are in, each gets InitWorker with the group id that names
its tensor-parallel group's shared memory and the address of the next pipeline stage's rank with its
tensor-parallel rank. From then on only the admitted ZMQ identities are heard. The scheduler reads one rank's
StepResult, the first rank of the last stage (the one that samples); the others only say they are done.
"""
import logging
import os
import time
import uuid

import zmq

from tinyvllm.protocol.codec import decode
from tinyvllm.protocol.compatibility import EngineShape, tinyvllm_version
from tinyvllm.protocol.messages import InitWorker, Shutdown, WorkerError, WorkerReady
from tinyvllm.protocol.parallel_layout import output_rank
from tinyvllm.protocol.transport import send
from tinyvllm.protocol.worker_auth import SECRET_ENV, require_secret_beyond_loopback
from tinyvllm.scheduler.worker_admission import WorkerAdmission

log = logging.getLogger("tinyvllm.scheduler")
MAX_IGNORED_PEERS_LOGGED = 100


class WorkerGroup:
    def __init__(self, sock: zmq.Socket, secret: str | None = None):
        """secret: shared with the workers; default: $TINYVLLM_WORKER_SECRET (the launcher's way to pass it)."""
        self.sock, self.address = sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.secret = os.environ.get(SECRET_ENV, "") if secret is None else secret
        require_secret_beyond_loopback(self.secret, worker_address=self.address)
        self.identities: dict[int, bytes] = {}
        self.output_rank = 0  # whose StepResult counts
        self.weight_bytes: dict[int, int] = {}  # by rank, as the workers reported them
        self.device = ""  # rank 0's tinygrad device, as its hello said (e.g. CPU, CUDA)
        self.ignored_peers: set[bytes] = set()
        self.kv_addresses: dict[int, str] = {}  # by rank: a prefill worker's KV side channel
        self.num_swap_slots = 0  # CPU swap: the slots every worker's swap space holds (scheduler/swap.py)
        self.kv_disk_dirs: dict[int, str] = {}  # by rank: the persistent prefix cache's folder (--kv-cache-dir)
        self.kv_disk_block_bytes = 0  # one block's files, every rank's
        self.kv_cache_dtype = ""  # what the workers' caches store (rank 0's, as every rank resolves it alike)

    def handshake(self, args) -> int:
        """Returns the number of KV blocks every worker can hold."""
        deadline = time.monotonic() + args.startup_timeout_s
        world_size = args.engine.world_size
        tp_size, pp_size = args.engine.parallel.tensor_parallel_size, args.engine.parallel.pipeline_parallel_size
        admission = WorkerAdmission(self.sock, self.secret, EngineShape(
            tinyvllm_version(), args.model_fingerprint, tp_size, pp_size, args.n_layers))
        log.info("waiting for %d workers (tp %d x pp %d) at %s", world_size, tp_size, pp_size, self.address)
        try:
            while len(admission.admitted) < world_size:
                identity, data, peer = self.recv_frames(deadline)
                admission.handle(identity, data, peer)
        except BaseException as e:  # they wait for InitWorker: tell them, so they exit (and may join the next one)
            for identity in [i for i, _ in admission.admitted.values()] + list(admission.pending):
                admission.send(identity, Shutdown(f"the engine did not start: {e or type(e).__name__}"))
            raise
        hellos = {rank: hello for rank, (_, hello) in admission.admitted.items()}
        self.device = hellos[0].device
        self.identities = {rank: identity for rank, (identity, _) in admission.admitted.items()}
        self.output_rank = output_rank(tp_size, pp_size)
        group_id = f"tinyvllm-{uuid.uuid4().hex[:12]}"
        for rank, identity in self.identities.items():
            after = rank + tp_size  # the same tensor-parallel rank of the next stage
            next_address = hellos[after].stage_address if after < world_size else ""
            send(self.sock, InitWorker(args.engine, group_id, next_address),
                 identity)
        ready: dict[int, WorkerReady] = {}
        while len(ready) < len(self.identities):
            _, msg = self.recv(deadline)
            if isinstance(msg, WorkerError):
                raise RuntimeError(f"worker {msg.rank} failed to start: {msg.message}")
            if isinstance(msg, WorkerReady):
                ready[msg.rank] = msg
                self.weight_bytes[msg.rank] = msg.weight_bytes
                if msg.kv_address:
                    self.kv_addresses[msg.rank] = msg.kv_address
                if msg.kv_disk_dir:
                    self.kv_disk_dirs[msg.rank] = msg.kv_disk_dir
                    self.kv_disk_block_bytes += msg.kv_disk_block_bytes
                log.info("worker rank %d ready: %.1f MB of weights, %d KV blocks", msg.rank, msg.weight_bytes / 1e6,
                         msg.num_blocks)
        self.num_swap_slots = min(r.num_swap_slots for r in ready.values())
        if len({r.kv_cache_dtype for r in ready.values()}) > 1:  # --kv-cache-dtype auto, --kernels differ
            raise RuntimeError("the workers' KV caches would store different dtypes (" + ", ".join(
                f"rank {rank} {r.kv_cache_dtype}" for rank, r in sorted(ready.items())) + "): give every worker "
                "the same --kernels, or --kv-cache-dtype explicitly")
        self.kv_cache_dtype = ready[0].kv_cache_dtype
        return min(r.num_blocks for r in ready.values())

    def recv_frames(self, deadline: float) -> tuple[bytes, bytes, str]:
        """(identity, message bytes, the peer's address) of the next message from any peer."""
        if not self.sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            raise TimeoutError("no answer from the workers in time")
        frames = self.sock.recv_multipart(copy=False)
        if len(frames) != 2:  # a DEALER sends one frame; ROUTER adds the identity
            return frames[0].bytes, b"", "?"
        peer = "ipc" if self.address.startswith("ipc://") else frames[1].get("Peer-Address") or "?"
        return frames[0].bytes, frames[1].bytes, peer

    def recv(self, deadline: float):
        """(identity, message) from an admitted worker; (identity, None) for anything else, ignored unread."""
        identity, data, peer = self.recv_frames(deadline)
        if identity not in self.identities.values():
            if identity not in self.ignored_peers and len(self.ignored_peers) < MAX_IGNORED_PEERS_LOGGED:
                self.ignored_peers.add(identity)
                log.warning("ignoring messages from a peer at %s that is not one of the admitted workers", peer)
            return identity, None
        return identity, decode(data)

    def broadcast(self, msg, skip_gone: bool = False) -> None:
        """skip_gone: a worker that is gone (ROUTER_MANDATORY's EHOSTUNREACH) is skipped instead of raising, so the
        others still hear a Shutdown after one was killed."""
        for rank, identity in self.identities.items():
            try:
                send(self.sock, msg, identity)
            except zmq.ZMQError as e:
                if not (skip_gone and e.errno == zmq.EHOSTUNREACH):
                    raise
                log.info("worker rank %d is gone: not told %s", rank, type(msg).__name__)
