"""The KV side channel between workers of a disaggregated deployment (vLLM's NixlConnector side channel, over ZMQ).

A prefill worker binds a ROUTER (KVSideChannel) and serves it from its own loop, between steps (tinygrad runs in one
thread). A decode worker (pull_blocks) connects a DEALER to it and sends KVPull{request_id, block_ids, compat_hash,
tp_rank}; the answer is one message per block, in order: [KVBlockData header, the block's raw bytes] (so each message
stays far below the message bound: one block of every layer), or one KVBlockData with an error and no bytes (a
compatibility-hash mismatch, a block out of range). After writing the blocks (or giving up) the decode worker sends
KVRelease{request_id}: the prefill worker tells its scheduler (KVReleased), which frees the leased blocks.
It serves only blocks its scheduler leased under that request id (StepPlan.kv_leases, until kv_leases_ended or the
puller's KVRelease), and every message carries an HMAC of the deployment's KV secret (protocol/kv_auth.py).
Messages are the codec's typed msgpack; the block bytes are raw float32, never pickle.
"""
import logging
import os
from collections.abc import Callable

import zmq

from zmq.utils.monitor import recv_monitor_message

from tinyvllm.protocol.codec import MAX_SEND_BYTES, CodecError, decode, encode
from tinyvllm.protocol.kv_auth import block_mac, new_nonce, pull_mac, release_mac, same_mac
from tinyvllm.protocol.kv_release import send_release
from tinyvllm.protocol.kv_compat import describe_mismatch
from tinyvllm.protocol.messages import KVBlockData, KVLoad, KVPull, KVRelease
from tinyvllm.protocol.transport import make_socket

log = logging.getLogger("tinyvllm.kv_side_channel")
PULL_TIMEOUT_ENV = "TINYVLLM_KV_PULL_TIMEOUT_S"
DEFAULT_PULL_TIMEOUT_S = 60.0  # between two blocks: a prefill worker serves pulls between its steps
CONNECT_TIMEOUT_MS = 5000  # a host that does not answer the TCP handshake
GONE_EVENTS = zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED  # nothing listens there (any more)


class KVPullError(RuntimeError):
    pass


class KVSideChannel:
    """The prefill worker's end. block_io: workers/kv_block_io.KVBlockIO; on_release(request_id) is called for each
    KVRelease."""

    def __init__(self, ctx: zmq.Context, address: str, block_io, compat_hash: str,
                 on_release: Callable[[str], None], secret: str = ""):
        self.sock = make_socket(ctx, zmq.ROUTER, address, bind=True)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.block_io, self.compat_hash, self.on_release, self.secret = block_io, compat_hash, on_release, secret
        self.leases: dict[str, list[int]] = {}  # request id -> the blocks a puller may read
        if block_io.nbytes > MAX_SEND_BYTES:  # would need a split per layer: not done yet
            raise ValueError(f"one KV block is {block_io.nbytes} bytes, over the {MAX_SEND_BYTES}-byte message bound")
        self.num_blocks_sent = 0

    def handle(self) -> None:
        """Serves every message waiting on the socket."""
        while self.sock.poll(0):
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
                if same_mac(msg.mac, release_mac(self.secret, msg.request_id, msg.nonce)):
                    self.leases.pop(msg.request_id, None)
                    self.on_release(msg.request_id)
                else:
                    log.warning("dropped a KV release for %s with a wrong MAC (another --kv-secret?)", msg.request_id)

    def _refusal(self, pull: KVPull) -> str:
        if not same_mac(pull.mac, pull_mac(self.secret, pull.request_id, pull.block_ids, pull.compat_hash,
                                           pull.tp_rank, pull.nonce)):
            return "the pull's MAC does not match: prefill and decode instances need the same --kv-secret"
        if pull.compat_hash != self.compat_hash:
            return describe_mismatch(self.compat_hash, pull.compat_hash)
        if self.leases.get(pull.request_id) != pull.block_ids:
            return (f"no lease on these blocks for {pull.request_id} (expired after --kv-lease-seconds, released, "
                    f"or never held)")
        return ""

    def _serve(self, identity: bytes, pull: KVPull) -> None:
        n = len(pull.block_ids)
        if error := self._refusal(pull):
            log.warning("refused a KV pull for %s: %s", pull.request_id, error)
            self._send(identity, pull, KVBlockData(pull.request_id, 0, n, error))
            return
        for i, block_id in enumerate(pull.block_ids):
            try:
                data = self.block_io.read(block_id)
            except ValueError as e:
                self._send(identity, pull, KVBlockData(pull.request_id, i, n, str(e)))
                return
            self._send(identity, pull, KVBlockData(pull.request_id, i, n), data)
            self.num_blocks_sent += 1

    def _send(self, identity: bytes, pull: KVPull, header: KVBlockData, data: bytes | None = None) -> None:
        header.mac = block_mac(self.secret, pull.nonce, header.request_id, header.index, header.error)
        frames = [identity, encode(header)] + ([data] if data is not None else [])
        try:
            self.sock.send_multipart(frames, copy=False)
        except zmq.ZMQError as e:  # the puller went away (ROUTER_MANDATORY): its request failed on its side
            log.warning("could not answer a KV pull for %s: %s", header.request_id, e)

    def close(self) -> None:
        self.sock.close(linger=0)


def side_channel_endpoint(load: KVLoad, tp_rank: int) -> str:
    """Rank r of the decode engine pulls from rank r of the prefill engine, bound at remote_port + r."""
    return f"tcp://{load.remote.remote_host}:{load.remote.remote_port + tp_rank}"


def pull_blocks(ctx: zmq.Context, load: KVLoad, block_io, compat_hash: str, tp_rank: int = 0,
                timeout_s: float | None = None, secret: str = "") -> None:
    """Pulls load's remote blocks into its local blocks, then releases them on the prefill side (also after a
    failure: the prefill instance need not wait for its lease to run out). KVPullError says what went wrong; a
    prefill worker that is gone (nothing listens, the connection dropped) fails it at once, not after timeout_s."""
    if timeout_s is None:
        timeout_s = float(os.environ.get(PULL_TIMEOUT_ENV) or DEFAULT_PULL_TIMEOUT_S)
    remote = load.remote
    endpoint = side_channel_endpoint(load, tp_rank)
    sock = make_socket(ctx, zmq.DEALER, endpoint, bind=False, options={zmq.CONNECT_TIMEOUT: CONNECT_TIMEOUT_MS})
    monitor = sock.get_monitor_socket(GONE_EVENTS)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    try:
        nonce, block_ids = new_nonce(), list(remote.remote_block_ids)
        sock.send(encode(KVPull(remote.remote_request_id, block_ids, compat_hash, tp_rank, nonce,
                                pull_mac(secret, remote.remote_request_id, block_ids, compat_hash, tp_rank, nonce))))
        for i, local in enumerate(load.local_block_ids):
            ready = dict(poller.poll(int(timeout_s * 1000)))
            if sock not in ready:
                why = ("nothing listens there (any more)" if monitor in ready
                       else f"no answer within {timeout_s:.0f} s")
                raise KVPullError(f"no answer from the prefill worker at {endpoint}: {why} "
                                  f"(block {i} of {len(load.local_block_ids)})")
            frames = sock.recv_multipart()
            header = decode(frames[0])
            if not isinstance(header, KVBlockData) or header.request_id != remote.remote_request_id:
                raise KVPullError(f"unexpected answer from {endpoint}: {type(header).__name__}")
            if header.error:  # a refusal fails the pull whoever sent it: no need to check its MAC
                raise KVPullError(f"the prefill worker at {endpoint} refused: {header.error}")
            if not same_mac(header.mac, block_mac(secret, nonce, header.request_id, header.index, header.error)):
                raise KVPullError(f"the answer from {endpoint} has a wrong MAC: not a prefill worker with this "
                                  f"--kv-secret")
            if header.index != i or len(frames) != 2:
                raise KVPullError(f"block {header.index} from {endpoint} where block {i} was expected")
            block_io.write(local, frames[1])
    except (CodecError, ValueError) as e:
        raise KVPullError(f"a bad answer from {endpoint}: {e}") from None
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        send_release(sock, remote.remote_request_id, secret)
