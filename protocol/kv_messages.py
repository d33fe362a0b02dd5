"""The messages of disaggregated prefill/decode (docs/ARCHITECTURE.md, "Disaggregated prefill and decode"): what a
StepPlan asks of the workers (KVLoad, KVLease), what a prefill worker tells its scheduler (KVReleased), and the KV
side channel between workers (KVPull, KVBlockData, KVRelease; workers/kv_side_channel.py). protocol/messages.py
re-exports them; the codec's tags are there."""
from dataclasses import dataclass

from tinyvllm.protocol.sampling import KVTransferParams


@dataclass(slots=True)
class KVLease:
    req_id: str
    block_ids: list[int]
    tokens_hash: str = ""  # protocol/kv_compat.tokens_hash of the tokens those blocks hold


@dataclass(slots=True)
class KVLoad:
    """Pull the remote blocks of a request's prompt into local_block_ids (same length, same order)."""
    req_id: str
    local_block_ids: list[int]
    remote: KVTransferParams
    tokens_hash: str = ""  # of the prompt tokens whose KV is pulled: the prefill worker checks it against its lease


@dataclass(slots=True)
class KVDiskBlock:
    """One block of the persistent prefix cache (scheduler/disk_kv.py): a KV block and the chain hash that names its
    file (protocol/block_hash.py)."""
    block_id: int
    block_hash: bytes


@dataclass(slots=True)
class KVReleased:
    """A prefill worker to its scheduler: these requests' leased blocks may go back to the pool."""
    rank: int
    req_ids: list[str]


@dataclass(slots=True)
class KVPull:
    """A decode worker to a prefill worker's side channel: send me these blocks of that request."""
    request_id: str
    block_ids: list[int]
    compat_hash: str  # protocol/kv_compat.py: must equal the prefill worker's, or the pull is refused
    tp_rank: int = 0
    nonce: bytes = b""
    mac: bytes = b""  # protocol/kv_auth.py
    head_start: int = 0  # which of the prefill worker's KV heads (start == stop: all)
    head_stop: int = 0
    tokens_hash: str = ""  # must be the lease's (protocol/kv_compat.tokens_hash)


@dataclass(slots=True)
class KVBlockData:
    """One answer to a KVPull per block (in the pull's order), each followed by a raw frame of the block's keys and
    values in every layer ([layers, block_size, 2, the pull's heads, head_dim] float32); or one with the error and no
    frame."""
    request_id: str
    index: int
    num_blocks: int
    error: str = ""
    mac: bytes = b""  # protocol/kv_auth.py: over the pull's nonce


@dataclass(slots=True)
class KVRelease:
    """A decode worker (or scheduler) to the side channel: done with that request's blocks (taken, or given up):
    free them."""
    request_id: str
    nonce: bytes = b""
    mac: bytes = b""  # protocol/kv_auth.py
    num_releases: int = 1  # the lease ends with this many releases (one per decode rank that pulled from this rank)
