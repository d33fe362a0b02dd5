"""The scheduler's side of its workers: the start-up handshake, then every plan to every worker.

Each worker says hello with its rank and its engine's tensor/pipeline sizes (protocol/parallel_layout.py); once
all `world_size` have, each gets InitWorker with the group id that names its tensor-parallel group's shared
memory and the address of the next pipeline stage's rank with its tensor-parallel rank. The scheduler reads one
rank's StepResult, the first rank of the last stage (the one that samples); the others only say they are done.
"""
import logging
import time
import uuid

import zmq

from tinyvllm.protocol.codec import decode
from tinyvllm.protocol.messages import InitWorker, WorkerError, WorkerHello, WorkerReady
from tinyvllm.protocol.parallel_layout import output_rank
from tinyvllm.protocol.transport import send

log = logging.getLogger("tinyvllm.scheduler")


class WorkerGroup:
    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.identities: dict[int, bytes] = {}
        self.output_rank = 0  # whose StepResult counts
        self.weight_bytes: dict[int, int] = {}  # by rank, as the workers reported them

    def handshake(self, args) -> int:
        """Returns the number of KV blocks every worker can hold."""
        deadline = time.monotonic() + args.startup_timeout_s
        hellos: dict[int, WorkerHello] = {}
        while len(hellos) < args.world_size:
            identity, msg = self.recv(deadline)
            if isinstance(msg, WorkerHello):
                if msg.world_size != args.world_size or msg.tp_size * msg.pp_size != args.world_size:
                    raise RuntimeError(f"worker rank {msg.rank} expects {msg.world_size} workers "
                                       f"(tp {msg.tp_size} x pp {msg.pp_size}); this engine has {args.world_size}")
                hellos[msg.rank], self.identities[msg.rank] = msg, identity
                log.info("worker rank %d (%s, pid %d) said hello", msg.rank, msg.device, msg.pid)
        tp_size, pp_size = hellos[0].tp_size, hellos[0].pp_size
        self.output_rank = output_rank(tp_size, pp_size)
        group_id = f"tinyvllm-{uuid.uuid4().hex[:12]}"
        for rank, identity in self.identities.items():
            after = rank + tp_size  # the same tensor-parallel rank of the next stage
            next_address = hellos[after].stage_address if after < args.world_size else ""
            send(self.sock, InitWorker(args.num_kv_blocks, args.kv_cache_bytes, args.block_size, args.max_model_len,
                                       args.max_num_seqs, args.max_num_batched_tokens, group_id, next_address),
                 identity)
        ready: dict[int, WorkerReady] = {}
        while len(ready) < len(self.identities):
            _, msg = self.recv(deadline)
            if isinstance(msg, WorkerError):
                raise RuntimeError(f"worker {msg.rank} failed to start: {msg.message}")
            if isinstance(msg, WorkerReady):
                ready[msg.rank] = msg
                self.weight_bytes[msg.rank] = msg.weight_bytes
                log.info("worker rank %d ready: %.1f MB of weights, %d KV blocks", msg.rank, msg.weight_bytes / 1e6,
                         msg.num_blocks)
        return min(r.num_blocks for r in ready.values())

    def recv(self, deadline: float):
        if not self.sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            raise TimeoutError("no answer from the workers in time")
        identity, data = self.sock.recv_multipart()
        return identity, decode(data)

    def broadcast(self, msg) -> None:
        for identity in self.identities.values():
            send(self.sock, msg, identity)
