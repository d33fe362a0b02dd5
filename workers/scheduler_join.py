"""A worker's side of the start-up handshake (protocol/worker_auth.py): say hello with what the scheduler checks,
make sure the scheduler knows the secret, prove that this worker does, and wait to be admitted. No tinygrad here."""
import logging
import os

import zmq

from tinyvllm.protocol.codec import encode
from tinyvllm.protocol.compatibility import model_fingerprint, tinyvllm_version
from tinyvllm.protocol.messages import (InitWorker, SchedulerChallenge, Shutdown, WorkerHello, WorkerProof,
                                        WorkerRefused)
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.protocol.model_path import resolve_model_path
from tinyvllm.protocol.parallel_layout import ShardSpec
from tinyvllm.protocol.transport import recv, send
from tinyvllm.protocol.worker_auth import (NONCE_BYTES, SECRET_ENV, new_nonce, proof_matches, scheduler_proof,
                                           worker_proof)

log = logging.getLogger("tinyvllm.worker")


class NoScheduler(RuntimeError):
    """No scheduler to work for: none answered, it stopped or refused this worker, or the connection dropped."""


class WorkerRefusedError(NoScheduler):
    """The scheduler refused this worker, or the peer could not prove it knows the secret: no point retrying."""


def worker_hello(args, device: str, stage_address: str) -> WorkerHello:
    """`args`: WorkerArgs. Reads the model's config and samples its files (model_fingerprint), nothing more."""
    path = resolve_model_path(args.model)
    layers = ShardSpec.of_rank(args.rank, args.tp_size, args.pp_size).layers(read_model_config(path).n_layers)
    return WorkerHello(args.rank, args.world_size, args.role, os.getpid(), device, args.tp_size, args.pp_size,
                       stage_address, tinyvllm_version(), model_fingerprint(path), [layers.start, layers.stop],
                       new_nonce())


def join_scheduler(sock: zmq.Socket, hello: WorkerHello, secret: str, answer_timeout_s: float,
                   receive=None) -> InitWorker:
    """Runs the handshake on a connected DEALER; returns InitWorker once every worker joined. Raises
    WorkerRefusedError, or NoScheduler when no scheduler answers the hello within answer_timeout_s or it stops first.
    receive: how to wait for InitWorker, as long as the other workers take (SchedulerWatch.recv, which raises
    NoScheduler when the connection drops; default: recv on the socket)."""
    hello_bytes = encode(hello)
    sock.send(hello_bytes)
    log.info("rank %d: said hello to the scheduler%s", hello.rank,
             f"; this stage's input is at {hello.stage_address}" if hello.stage_address else "")
    if not sock.poll(int(answer_timeout_s * 1000)):
        raise NoScheduler(f"no scheduler answered within {answer_timeout_s:.0f} s")
    challenge = _next(sock, SchedulerChallenge)
    if len(challenge.nonce) != NONCE_BYTES or not proof_matches(
            scheduler_proof(secret, hello.nonce, challenge.nonce), challenge.proof):
        send(sock, WorkerProof(b""))  # no proof for an unproven peer, but an answer, so the scheduler logs why
        raise WorkerRefusedError(f"the scheduler could not prove it knows the worker secret: is {SECRET_ENV} "
                                 f"(or --worker-secret) the same on both sides?")
    send(sock, WorkerProof(worker_proof(secret, challenge.nonce, hello.nonce, hello_bytes)))
    return _next(sock, InitWorker, receive)


def _next(sock: zmq.Socket, expected: type, receive=None):
    msg = receive() if receive is not None else recv(sock)
    if isinstance(msg, WorkerRefused):
        raise WorkerRefusedError(f"refused by the scheduler: {msg.reason}")
    if isinstance(msg, Shutdown):
        raise NoScheduler(f"the scheduler stopped before the engine started: {msg.reason}")
    if not isinstance(msg, expected):
        raise NoScheduler(f"expected {expected.__name__} from the scheduler, got {type(msg).__name__}")
    return msg
