"""The KV side channel between workers of a disaggregated deployment (vLLM's NixlConnector side channel, over ZMQ).

A prefill worker binds a ROUTER (KVSideChannel) and serves it from its own loop, between steps (tinygrad runs in one
thread). A decode worker (workers/kv_pull.py) connects a DEALER to it and sends KVPull{request_id, block_ids,
compat_hash, tp_rank, heads}; the answer is one message per block, in order: [KVBlockData header, the block's raw
bytes, the pull's heads only] (so each message stays far below the message bound: one block of every layer), or one
KVBlockData with an error and no bytes (a compatibility-hash mismatch, a block not leased). After writing the blocks
(or giving up) each decode rank that pulled sends KVRelease{request_id, num_releases}; with num_releases of them the
prefill worker tells its scheduler (KVReleased), which frees the leased blocks.
It serves only blocks its scheduler leased under that request id (StepPlan.kv_leases, until kv_leases_ended or the
releases), and every message carries an HMAC of the deployment's KV secret (protocol/kv_auth.py).
Messages are the codec's typed msgpack; the block bytes are raw cache values and scales (workers/kv_block_io.py),
never pickle.
"""
import logging
from collections.abc import Callable

import zmq

from tinyvllm.protocol import codec
from tinyvllm.protocol.codec import CodecError, decode, encode
from tinyvllm.protocol.kv_auth import block_mac, pull_mac, release_mac, same_mac
from tinyvllm.protocol.kv_compat import describe_mismatch
from tinyvllm.protocol.messages import KVBlockData, KVPull, KVRelease
from tinyvllm.protocol.transport import make_socket

log = logging.getLogger("tinyvllm.kv_side_channel")
MAX_REQUEST_BYTES = 1 << 20  # a pull names at most the pool's blocks; bigger messages are dropped by ZMQ unread
MAX_MESSAGES_PER_CALL = 64  # then the worker's next step: a flood of pulls never starves it
SEND_TIMEOUT_MS = 5000  # a puller that stops reading loses its pull, it does not stall this worker


class KVSideChannel:
    """The prefill worker's end. block_io: workers/kv_block_io.KVBlockIO; on_release(request_id) is called once the
    last release of a lease came."""

    def __init__(self, ctx: zmq.Context, address: str, block_io, compat_hash: str,
                 on_release: Callable[[str], None], secret: str = ""):
        self.sock = make_socket(ctx, zmq.ROUTER, address, bind=True,
                                options={zmq.MAXMSGSIZE: MAX_REQUEST_BYTES, zmq.SNDTIMEO: SEND_TIMEOUT_MS})
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.block_io, self.compat_hash, self.on_release, self.secret = block_io, compat_hash, on_release, secret
        self.leases: dict[str, tuple[list[int], str]] = {}  # request id -> (the blocks a puller may read, tokens hash)
        self.releases: dict[str, int] = {}  # request id -> releases so far, of a lease that needs several
        if block_io.nbytes > codec.MAX_SEND_BYTES:  # would need a split per layer: not done yet
            raise ValueError(f"one KV block is {block_io.nbytes} bytes, over the {codec.MAX_SEND_BYTES}-byte message "
                             f"bound")
        self.num_blocks_sent = 0

    def end_lease(self, request_id: str) -> None:
        self.leases.pop(request_id, None)
        self.releases.pop(request_id, None)

    def handle(self) -> None:
        """Serves the messages waiting on the socket (up to MAX_MESSAGES_PER_CALL)."""
        for _ in range(MAX_MESSAGES_PER_CALL):
            if not self.sock.poll(0):
                return
            frames = self.sock.recv_multipart()
            if len(frames) != 2:
                continue
            identity, data = frames
            try:
                msg = decode(data)
            except CodecError as e:
                log.warning("dropped a malformed side-channel message: %s", e)
                continue
            if isinstance(msg, KVPull):
                self._serve(identity, msg)
            elif isinstance(msg, KVRelease):
                self._release(msg)

    def _release(self, msg: KVRelease) -> None:
        if not same_mac(msg.mac, release_mac(self.secret, msg.request_id, msg.nonce, msg.num_releases)):
            log.warning("dropped a KV release for %s with a wrong MAC (another --kv-secret?)", msg.request_id)
            return
        done = self.releases.get(msg.request_id, 0) + 1
        if done < min(msg.num_releases, 1024) and msg.request_id in self.leases:
            self.releases[msg.request_id] = done
            return
        self.end_lease(msg.request_id)
        self.on_release(msg.request_id)

    def _refusal(self, pull: KVPull) -> str:
        lease = self.leases.get(pull.request_id)
        if lease is None or lease[0] != pull.block_ids:  # first, as it is cheap: no MAC over junk
            return (f"no lease on these blocks for {pull.request_id} (expired after --kv-lease-seconds, released, "
                    f"or never held)")
        if not same_mac(pull.mac, pull_mac(self.secret, pull)):
            return "the pull's MAC does not match: prefill and decode instances need the same --kv-secret"
        if pull.compat_hash != self.compat_hash:
            return describe_mismatch(self.compat_hash, pull.compat_hash)
        if pull.tokens_hash != lease[1]:
            return f"the KV of {pull.request_id} was computed for other tokens than this prompt's"
        if not 0 <= pull.head_start <= pull.head_stop <= self.block_io.shape[3]:
            return f"KV heads {pull.head_start}..{pull.head_stop} asked of a worker that holds {self.block_io.shape[3]}"
        return ""

    def _serve(self, identity: bytes, pull: KVPull) -> None:
        n = len(pull.block_ids)
        if error := self._refusal(pull):
            log.warning("refused a KV pull for %s: %s", pull.request_id, error)
            self._send(identity, pull, KVBlockData(pull.request_id, 0, n, error))
            return
        some_heads = pull.head_start < pull.head_stop and pull.head_stop - pull.head_start < self.block_io.shape[3]
        for i, block_id in enumerate(pull.block_ids):
            try:
                data = self.block_io.read(block_id)
            except ValueError as e:  # out of range: a lease the scheduler never made
                self._send(identity, pull, KVBlockData(pull.request_id, i, n, str(e)))
                return
            if some_heads:
                data = self.block_io.heads(data, pull.head_start, pull.head_stop)
            if not self._send(identity, pull, KVBlockData(pull.request_id, i, n), data):
                return
            self.num_blocks_sent += 1

    def _send(self, identity: bytes, pull: KVPull, header: KVBlockData, data: bytes | None = None) -> bool:
        header.mac = block_mac(self.secret, pull.nonce, header.request_id, header.index, header.error, data or b"")
        frames = [identity, encode(header)] + ([data] if data is not None else [])
        try:
            self.sock.send_multipart(frames, copy=False)
            return True
        except zmq.ZMQError as e:  # the puller went away (ROUTER_MANDATORY) or stopped reading: its pull fails there
            log.warning("could not answer a KV pull for %s: %s", header.request_id, e)
            return False

    def close(self) -> None:
        self.sock.close(linger=0)
