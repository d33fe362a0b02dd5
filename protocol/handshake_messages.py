"""The worker's handshake with the scheduler (protocol/messages.py re-exports them; scheduler/worker_group.py and
workers/scheduler_join.py use them): a worker's hello, the mutual proof of the shared secret, or a refusal."""
from dataclasses import dataclass, field


@dataclass(slots=True)
class WorkerHello:
    rank: int  # protocol/parallel_layout.py: pp_rank * tp_size + tp_rank
    world_size: int
    role: str
    pid: int
    device: str
    tp_size: int = 1
    pp_size: int = 1
    stage_address: str = ""  # where a later pipeline stage receives the previous stage's hidden states
    # What the scheduler checks before admitting it (protocol/compatibility.py) and its half of the mutual
    # authentication (protocol/worker_auth.py).
    version: str = ""
    model_fingerprint: str = ""
    layers: list[int] = field(default_factory=list)  # [start, stop) of the model's layers this worker holds
    nonce: bytes = b""


@dataclass(slots=True)
class SchedulerChallenge:
    """The answer to a hello: the scheduler's proof that it knows the shared secret, and its own nonce."""
    nonce: bytes
    proof: bytes


@dataclass(slots=True)
class WorkerProof:
    """The worker's proof that it knows the shared secret (over the scheduler's nonce and its hello)."""
    proof: bytes


@dataclass(slots=True)
class WorkerRefused:
    """The scheduler will not take this worker (bad secret, another model or version, a rank taken); it exits."""
    reason: str
