"""The scheduler's side of the start-up handshake (protocol/worker_auth.py): which peers of the worker socket become
the engine's workers.

A peer says hello and gets a challenge (with the scheduler's proof); it answers with its own proof. A wrong proof, a
hello this engine cannot use (protocol/compatibility.py), a rank already taken or an undecodable message is refused:
a log line naming the peer and the reason, and a WorkerRefused back, never InitWorker. Nothing a peer sends before
its proof is trusted; once admitted, its ZMQ identity is how the scheduler knows it.
"""
import logging
from dataclasses import dataclass

import zmq

from tinyvllm.protocol.codec import CodecError, decode
from tinyvllm.protocol.compatibility import EngineShape, compatibility_problem
from tinyvllm.protocol.messages import SchedulerChallenge, WorkerHello, WorkerProof, WorkerRefused
from tinyvllm.protocol.transport import send
from tinyvllm.protocol.worker_auth import (NONCE_BYTES, SECRET_ENV, new_nonce, proof_matches, scheduler_proof,
                                           worker_proof)

log = logging.getLogger("tinyvllm.scheduler")
MAX_PENDING = 256  # handshakes under way at once: peers that say hello and never prove anything cannot pile up


@dataclass(slots=True)
class _Pending:
    hello: WorkerHello
    hello_bytes: bytes
    nonce: bytes
    peer: str


class WorkerAdmission:
    def __init__(self, sock: zmq.Socket, secret: str, expected: EngineShape):
        self.sock, self.secret, self.expected = sock, secret, expected
        self.pending: dict[bytes, _Pending] = {}  # by ZMQ identity: challenged, not yet proven
        self.admitted: dict[int, tuple[bytes, WorkerHello]] = {}  # by rank: (identity, hello)

    def handle(self, identity: bytes, data: bytes, peer: str) -> None:
        """One message from a peer that is not admitted yet; `peer` names it (its IP address on tcp)."""
        try:
            msg = decode(data)
        except CodecError as e:
            self.refuse(identity, f"a peer at {peer}", f"an undecodable message ({e}); another tinyvllm version?")
            return
        if isinstance(msg, WorkerHello):
            self.challenge(identity, msg, data, peer)
        elif isinstance(msg, WorkerProof) and identity in self.pending:
            self.check(identity, self.pending.pop(identity), msg.proof)
        else:
            self.refuse(identity, f"a peer at {peer}", f"{type(msg).__name__} before a hello and its proof")

    def challenge(self, identity: bytes, hello: WorkerHello, hello_bytes: bytes, peer: str) -> None:
        if len(hello.nonce) != NONCE_BYTES:
            self.refuse(identity, describe(hello, peer), f"a hello without a {NONCE_BYTES}-byte nonce")
            return
        if identity not in self.pending and len(self.pending) >= MAX_PENDING:
            # the oldest unfinished one goes, not the newcomer: peers that say hello and never prove anything (or
            # died halfway) cannot lock the real workers out; a real worker proves within milliseconds
            evicted, old = next(iter(self.pending.items()))
            del self.pending[evicted]
            log.warning("dropped the unfinished handshake of %s: %d handshakes are under way",
                        describe(old.hello, old.peer), MAX_PENDING)
        nonce = new_nonce()
        self.pending[identity] = _Pending(hello, hello_bytes, nonce, peer)
        self.send(identity, SchedulerChallenge(nonce, scheduler_proof(self.secret, hello.nonce, nonce)))

    def check(self, identity: bytes, pending: _Pending, proof: bytes) -> None:
        hello, who = pending.hello, describe(pending.hello, pending.peer)
        if not proof_matches(worker_proof(self.secret, pending.nonce, hello.nonce, pending.hello_bytes), proof):
            self.refuse(identity, who, f"it does not know the worker secret (is {SECRET_ENV} the same on both sides?)")
        elif (problem := compatibility_problem(self.expected, hello)) is not None:
            self.refuse(identity, who, problem)
        else:
            if (earlier := self.admitted.get(hello.rank)) is not None:  # the newest proven worker keeps the rank:
                # a restarted worker (the earlier one is gone) must not be locked out by its old self
                self.refuse(earlier[0], describe(earlier[1], "its earlier address"),
                            f"another worker joined as rank {hello.rank} (restarted, or two were given that rank?)")
            self.admitted[hello.rank] = (identity, hello)
            log.info("%s joined (%d of %d workers)", who, len(self.admitted), self.expected.tp_size *
                     self.expected.pp_size)

    def refuse(self, identity: bytes, who: str, reason: str) -> None:
        log.warning("refused %s: %s", who, reason)
        self.pending.pop(identity, None)
        self.send(identity, WorkerRefused(reason))

    def send(self, identity: bytes, msg) -> None:
        try:
            send(self.sock, msg, identity)
        except zmq.ZMQError:  # the peer is gone already (ROUTER_MANDATORY): nothing to tell it
            pass


def describe(hello: WorkerHello, peer: str) -> str:
    """A peer as the log names it: what it claims and where it connects from."""
    return f"worker rank {hello.rank} ({hello.device}, pid {hello.pid}) at {peer}"
