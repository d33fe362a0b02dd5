"""The decode worker's end of the KV side channel (workers/kv_side_channel.py has the prefill end and the protocol).

Rank r of a decode engine holds some of the model's KV heads (protocol/parallel_layout.kv_head_range); each comes from
the first rank of the prefill engine that holds it, so the two engines may have different tensor-parallel sizes:
kv_sources says which prefill ranks rank r pulls from and which of their heads. Every prefill rank gets as many
KVReleases as there are decode ranks that touch it (release_ranks): its lease ends only when the last is done.
"""
import os
import time
from dataclasses import dataclass

import zmq

from tinyvllm.protocol.codec import decode, encode
from tinyvllm.protocol.kv_auth import block_mac, new_nonce, pull_mac, same_mac
from tinyvllm.protocol.kv_release import endpoint_of, send_release
from tinyvllm.protocol.messages import KVBlockData, KVLoad, KVPull
from tinyvllm.protocol.parallel_layout import kv_head_range
from tinyvllm.protocol.transport import make_socket
from tinyvllm.protocol.worker_auth import is_loopback

PULL_TIMEOUT_ENV = "TINYVLLM_KV_PULL_TIMEOUT_S"
DEFAULT_PULL_TIMEOUT_S = 30.0  # for all of a step's pulls (a prefill worker serves them between its steps): well
# under the frontend's --step-timeout (120 s), which would count this engine as hung
CONNECT_TIMEOUT_MS = 5000  # a host that does not answer the TCP handshake
GONE_EVENTS = zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED  # nothing listens there (any more)


class KVPullError(RuntimeError):
    pass


def pull_deadline() -> float:
    """When a step's pulls must be done (time.monotonic): TINYVLLM_KV_PULL_TIMEOUT_S from now."""
    return time.monotonic() + float(os.environ.get(PULL_TIMEOUT_ENV) or DEFAULT_PULL_TIMEOUT_S)


@dataclass(frozen=True)
class KVSource:
    prefill_rank: int
    remote_heads: range  # in the prefill rank's own head numbering
    local_heads: range  # in this decode rank's


def kv_sources(n_kv_heads: int, prefill_tp: int, decode_tp: int, decode_rank: int) -> list[KVSource]:
    """ValueError when the prefill engine's tensor-parallel size cannot split the model's KV heads."""
    if n_kv_heads % prefill_tp and prefill_tp % n_kv_heads:
        raise ValueError(f"a prefill engine of tensor-parallel size {prefill_tp} cannot hold {n_kv_heads} KV heads")
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


class _Pull:
    """One KVPull to one prefill rank, read block by block."""

    def __init__(self, ctx, load: KVLoad, source: KVSource | None, compat_hash: str, tp_rank: int,
                 secret: str, prefill_rank: int):
        remote = load.remote
        self.endpoint, self.remote, self.secret = endpoint_of(remote, prefill_rank), remote, secret
        if not secret and not is_loopback(self.endpoint):
            raise KVPullError(f"pulling from {self.endpoint} needs a KV secret (--kv-secret or TINYVLLM_KV_SECRET), "
                              f"the prefill instance's: without it anyone there could answer")
        self.sock = make_socket(ctx, zmq.DEALER, self.endpoint, bind=False,
                                options={zmq.CONNECT_TIMEOUT: CONNECT_TIMEOUT_MS})
        self.monitor = self.sock.get_monitor_socket(GONE_EVENTS)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.nonce = new_nonce()
        if source is not None:
            heads = source.remote_heads
            pull = KVPull(remote.remote_request_id, list(remote.remote_block_ids), compat_hash, tp_rank, self.nonce,
                          b"", heads.start, heads.stop, load.tokens_hash)
            pull.mac = pull_mac(secret, pull)
            self.sock.send(encode(pull))

    def block(self, i: int, n: int, deadline: float) -> bytes:
        ready = dict(self.poller.poll(max(0, int((deadline - time.monotonic()) * 1000))))
        if self.sock not in ready:
            why = "nothing listens there (any more)" if self.monitor in ready else "no answer in time"
            raise KVPullError(f"no answer from the prefill worker at {self.endpoint}: {why} (block {i} of {n})")
        frames = self.sock.recv_multipart()
        header = decode(frames[0])
        if not isinstance(header, KVBlockData) or header.request_id != self.remote.remote_request_id:
            raise KVPullError(f"unexpected answer from {self.endpoint}: {type(header).__name__}")
        if header.error:  # a refusal fails the pull whoever sent it: no need to check its MAC
            raise KVPullError(f"the prefill worker at {self.endpoint} refused: {header.error}")
        if len(frames) != 2 or not same_mac(header.mac, block_mac(self.secret, self.nonce, header.request_id,
                                                                  header.index, header.error, frames[1])):
            raise KVPullError(f"the answer from {self.endpoint} has a wrong MAC: not a prefill worker with this "
                              f"--kv-secret")
        if header.index != i:
            raise KVPullError(f"block {header.index} from {self.endpoint} where block {i} was expected")
        return frames[1]

    def close(self, num_releases: int) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        send_release(self.sock, self.remote.remote_request_id, self.secret, num_releases)


def pull_blocks(ctx: zmq.Context, load: KVLoad, block_io, compat_hash: str, n_kv_heads: int, tp_rank: int = 0,
                tp_size: int = 1, deadline: float | None = None, secret: str = "") -> None:
    """Pulls this decode rank's heads of load's remote blocks into its local blocks by `deadline` (time.monotonic;
    default: TINYVLLM_KV_PULL_TIMEOUT_S from now), then releases the prefill ranks it touched (also after a failure:
    the prefill instance need not wait for its lease to run out). KVPullError says what went wrong, whatever it was;
    a prefill worker that is gone (nothing listens, the connection dropped) fails it at once."""
    if deadline is None:
        deadline = pull_deadline()
    remote, n = load.remote, len(load.local_block_ids)
    pulls: dict[int, _Pull] = {}
    releases: dict[int, int] = {}
    try:
        prefill_tp = max(1, remote.tp_size)
        sources = kv_sources(n_kv_heads, prefill_tp, tp_size, tp_rank)
        releases = {q: len(ranks) for q, ranks in release_ranks(n_kv_heads, prefill_tp, tp_size).items()
                    if tp_rank in ranks}
        by_rank = {s.prefill_rank: s for s in sources}
        for q in releases:
            pulls[q] = _Pull(ctx, load, by_rank.get(q), compat_hash, tp_rank, secret, q)
        whole = len(sources) == 1 and sources[0].local_heads == range(block_io.shape[3])
        for i, local in enumerate(load.local_block_ids):
            if whole:
                block_io.write(local, pulls[sources[0].prefill_rank].block(i, n, deadline))
                continue
            block = block_io.empty_parts()
            for s in sources:
                got = block_io.parts(pulls[s.prefill_rank].block(i, n, deadline), len(s.local_heads))
                for whole_part, part in zip(block, got):
                    whole_part[:, :, :, s.local_heads.start:s.local_heads.stop] = part
            block_io.write(local, block_io.join(block))
    except KVPullError:
        raise
    except Exception as e:  # a bad answer or bad parameters: this request fails, never the worker
        raise KVPullError(f"pulling the KV of {remote.remote_request_id} from {remote.remote_host}: {e!r}") from None
    finally:
        for q, pull in pulls.items():
            pull.close(releases[q])
