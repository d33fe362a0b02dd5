"""The decode worker's end of the KV side channel (workers/kv_side_channel.py has the prefill end and the protocol).

Rank r of a decode engine holds some of the model's KV heads (protocol/parallel_layout.kv_head_range); each comes from
the first rank of the prefill engine that holds it, so the two engines may have different tensor-parallel sizes:
kv_sources says which prefill ranks rank r pulls from and which of their heads. Every prefill rank gets as many
KVReleases as there are decode ranks that touch it (release_ranks): its lease ends only when the last is done.
"""
import os
from dataclasses import dataclass

import numpy as np
import zmq

from tinyvllm.protocol.codec import CodecError, decode, encode
from tinyvllm.protocol.kv_auth import block_mac, new_nonce, pull_mac, same_mac
from tinyvllm.protocol.kv_release import send_release
from tinyvllm.protocol.messages import KVBlockData, KVLoad, KVPull, KVTransferParams
from tinyvllm.protocol.parallel_layout import kv_head_range
from tinyvllm.protocol.transport import make_socket

PULL_TIMEOUT_ENV = "TINYVLLM_KV_PULL_TIMEOUT_S"
DEFAULT_PULL_TIMEOUT_S = 60.0  # between two blocks: a prefill worker serves pulls between its steps
CONNECT_TIMEOUT_MS = 5000  # a host that does not answer the TCP handshake
GONE_EVENTS = zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED  # nothing listens there (any more)


class KVPullError(RuntimeError):
    pass


@dataclass(frozen=True)
class KVSource:
    prefill_rank: int
    remote_heads: range  # in the prefill rank's own head numbering
    local_heads: range  # in this decode rank's


def kv_sources(n_kv_heads: int, prefill_tp: int, decode_tp: int, decode_rank: int) -> list[KVSource]:
    mine = kv_head_range(n_kv_heads, decode_rank, decode_tp)
    held = [kv_head_range(n_kv_heads, q, prefill_tp) for q in range(prefill_tp)]
    sources: list[KVSource] = []
    for head in mine:
        q = next(q for q, heads in enumerate(held) if head in heads)
        remote, local = head - held[q].start, head - mine.start
        if sources and sources[-1].prefill_rank == q and sources[-1].remote_heads.stop == remote:
            last = sources.pop()
            sources.append(KVSource(q, range(last.remote_heads.start, remote + 1), range(last.local_heads.start,
                                                                                        local + 1)))
        else:
            sources.append(KVSource(q, range(remote, remote + 1), range(local, local + 1)))
    return sources


def release_ranks(n_kv_heads: int, prefill_tp: int, decode_tp: int) -> dict[int, list[int]]:
    """prefill rank -> the decode ranks that release it: those that pull from it, or, for a rank whose heads all
    come from another (replicated heads), one decode rank all the same."""
    touched: dict[int, list[int]] = {q: [] for q in range(prefill_tp)}
    for r in range(decode_tp):
        for q in sorted({s.prefill_rank for s in kv_sources(n_kv_heads, prefill_tp, decode_tp, r)}):
            touched[q].append(r)
    return {q: ranks or [q % decode_tp] for q, ranks in touched.items()}


def endpoint_of(remote: KVTransferParams, prefill_rank: int) -> str:
    """Rank q of a prefill engine serves at remote_port + q."""
    return f"tcp://{remote.remote_host}:{remote.remote_port + prefill_rank}"


class _Pull:
    """One KVPull to one prefill rank, read block by block."""

    def __init__(self, ctx, remote: KVTransferParams, source: KVSource | None, compat_hash: str, tp_rank: int,
                 secret: str, prefill_rank: int):
        self.endpoint, self.remote, self.secret = endpoint_of(remote, prefill_rank), remote, secret
        self.sock = make_socket(ctx, zmq.DEALER, self.endpoint, bind=False,
                                options={zmq.CONNECT_TIMEOUT: CONNECT_TIMEOUT_MS})
        self.monitor = self.sock.get_monitor_socket(GONE_EVENTS)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.nonce = new_nonce()
        if source is not None:
            ids, heads = list(remote.remote_block_ids), source.remote_heads
            self.sock.send(encode(KVPull(remote.remote_request_id, ids, compat_hash, tp_rank, self.nonce,
                                         pull_mac(secret, remote.remote_request_id, ids, compat_hash, tp_rank,
                                                  self.nonce, heads.start, heads.stop), heads.start, heads.stop)))

    def block(self, i: int, n: int, timeout_s: float) -> bytes:
        ready = dict(self.poller.poll(int(timeout_s * 1000)))
        if self.sock not in ready:
            why = "nothing listens there (any more)" if self.monitor in ready else f"no answer within {timeout_s:.0f} s"
            raise KVPullError(f"no answer from the prefill worker at {self.endpoint}: {why} (block {i} of {n})")
        frames = self.sock.recv_multipart()
        header = decode(frames[0])
        if not isinstance(header, KVBlockData) or header.request_id != self.remote.remote_request_id:
            raise KVPullError(f"unexpected answer from {self.endpoint}: {type(header).__name__}")
        if header.error:  # a refusal fails the pull whoever sent it: no need to check its MAC
            raise KVPullError(f"the prefill worker at {self.endpoint} refused: {header.error}")
        if not same_mac(header.mac, block_mac(self.secret, self.nonce, header.request_id, header.index, header.error)):
            raise KVPullError(f"the answer from {self.endpoint} has a wrong MAC: not a prefill worker with this "
                              f"--kv-secret")
        if header.index != i or len(frames) != 2:
            raise KVPullError(f"block {header.index} from {self.endpoint} where block {i} was expected")
        return frames[1]

    def close(self, num_releases: int) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        send_release(self.sock, self.remote.remote_request_id, self.secret, num_releases)


def pull_blocks(ctx: zmq.Context, load: KVLoad, block_io, compat_hash: str, n_kv_heads: int, tp_rank: int = 0,
                tp_size: int = 1, timeout_s: float | None = None, secret: str = "") -> None:
    """Pulls this decode rank's heads of load's remote blocks into its local blocks, then releases the prefill ranks
    it touched (also after a failure: the prefill instance need not wait for its lease to run out). KVPullError says
    what went wrong; a prefill worker that is gone (nothing listens, the connection dropped) fails it at once."""
    if timeout_s is None:
        timeout_s = float(os.environ.get(PULL_TIMEOUT_ENV) or DEFAULT_PULL_TIMEOUT_S)
    remote, n = load.remote, len(load.local_block_ids)
    prefill_tp = max(1, remote.tp_size)
    sources = kv_sources(n_kv_heads, prefill_tp, tp_size, tp_rank)
    releases = {q: len(ranks) for q, ranks in release_ranks(n_kv_heads, prefill_tp, tp_size).items()
                if tp_rank in ranks}
    by_rank = {s.prefill_rank: s for s in sources}
    pulls = {q: _Pull(ctx, remote, by_rank.get(q), compat_hash, tp_rank, secret, q) for q in releases}
    whole = len(sources) == 1 and sources[0].local_heads == range(block_io.shape[3])
    try:
        for i, local in enumerate(load.local_block_ids):
            if whole:
                block_io.write(local, pulls[sources[0].prefill_rank].block(i, n, timeout_s))
                continue
            block = np.empty(block_io.shape, np.float32)
            for s in sources:
                part = np.frombuffer(pulls[s.prefill_rank].block(i, n, timeout_s), np.float32)
                block[:, :, :, s.local_heads.start:s.local_heads.stop] = part.reshape(
                    *block_io.shape[:3], len(s.local_heads), block_io.shape[4])
            block_io.write(local, block.tobytes())
    except (CodecError, ValueError) as e:
        raise KVPullError(f"a bad answer from the prefill side of {remote.remote_request_id}: {e}") from None
    finally:
        for q, pull in pulls.items():
            pull.close(releases[q])
