"""The KV side channel between workers of a disaggregated deployment (vLLM's NixlConnector side channel, over ZMQ).

A prefill worker binds a ROUTER (KVSideChannel) and serves it from its own loop, between steps (tinygrad runs in one
thread). A decode worker (pull_blocks) connects a DEALER to it and sends KVPull{request_id, block_ids, compat_hash,
tp_rank}; the answer is one message per block, in order: [KVBlockData header, the block's raw bytes] (so each message
stays far below the message bound: one block of every layer), or one KVBlockData with an error and no bytes (a
compatibility-hash mismatch, a block out of range). After writing the blocks (or giving up) the decode worker sends
KVRelease{request_id}: the prefill worker tells its scheduler (KVReleased), which frees the leased blocks.
Messages are the codec's typed msgpack; the block bytes are raw float32, never pickle.
"""
import logging
import os
import time
from collections.abc import Callable

import zmq

from tinyvllm.protocol.codec import MAX_SEND_BYTES, CodecError, decode, encode
from tinyvllm.protocol.kv_compat import describe_mismatch
from tinyvllm.protocol.messages import KVBlockData, KVLoad, KVPull, KVRelease
from tinyvllm.protocol.transport import make_socket

log = logging.getLogger("tinyvllm.kv_side_channel")
PULL_TIMEOUT_ENV = "TINYVLLM_KV_PULL_TIMEOUT_S"
DEFAULT_PULL_TIMEOUT_S = 60.0  # between two blocks: a prefill worker serves pulls between its steps


class KVPullError(RuntimeError):
    pass


class KVSideChannel:
    """The prefill worker's end. block_io: workers/kv_block_io.KVBlockIO; on_release(request_id) is called for each
    KVRelease."""

    def __init__(self, ctx: zmq.Context, address: str, block_io, compat_hash: str,
                 on_release: Callable[[str], None]):
        self.sock = make_socket(ctx, zmq.ROUTER, address, bind=True)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.block_io, self.compat_hash, self.on_release = block_io, compat_hash, on_release
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
                self.on_release(msg.request_id)

    def _serve(self, identity: bytes, pull: KVPull) -> None:
        n = len(pull.block_ids)
        if pull.compat_hash != self.compat_hash:
            error = describe_mismatch(self.compat_hash, pull.compat_hash)
            log.warning("refused a KV pull for %s: %s", pull.request_id, error)
            self._send(identity, KVBlockData(pull.request_id, 0, n, error))
            return
        for i, block_id in enumerate(pull.block_ids):
            try:
                data = self.block_io.read(block_id)
            except ValueError as e:
                self._send(identity, KVBlockData(pull.request_id, i, n, str(e)))
                return
            self._send(identity, KVBlockData(pull.request_id, i, n), data)
            self.num_blocks_sent += 1

    def _send(self, identity: bytes, header: KVBlockData, data: bytes | None = None) -> None:
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
                timeout_s: float | None = None) -> None:
    """Pulls load's remote blocks into its local blocks, then releases them on the prefill side (also after a
    failure: the prefill instance need not wait for its lease to run out). KVPullError says what went wrong."""
    if timeout_s is None:
        timeout_s = float(os.environ.get(PULL_TIMEOUT_ENV) or DEFAULT_PULL_TIMEOUT_S)
    remote = load.remote
    endpoint = side_channel_endpoint(load, tp_rank)
    sock = make_socket(ctx, zmq.DEALER, endpoint, bind=False)
    try:
        sock.send(encode(KVPull(remote.remote_request_id, list(remote.remote_block_ids), compat_hash, tp_rank)))
        for i, local in enumerate(load.local_block_ids):
            if not sock.poll(int(timeout_s * 1000)):
                raise KVPullError(f"no answer from the prefill worker at {endpoint} within {timeout_s:.0f} s "
                                  f"(block {i} of {len(load.local_block_ids)})")
            frames = sock.recv_multipart()
            header = decode(frames[0])
            if not isinstance(header, KVBlockData) or header.request_id != remote.remote_request_id:
                raise KVPullError(f"unexpected answer from {endpoint}: {type(header).__name__}")
            if header.error:
                raise KVPullError(f"the prefill worker at {endpoint} refused: {header.error}")
            if header.index != i or len(frames) != 2:
                raise KVPullError(f"block {header.index} from {endpoint} where block {i} was expected")
            block_io.write(local, frames[1])
    except (CodecError, ValueError) as e:
        raise KVPullError(f"a bad answer from {endpoint}: {e}") from None
    finally:
        try:
            sock.send(encode(KVRelease(remote.remote_request_id)), zmq.NOBLOCK)
            time.sleep(0)  # the DEALER queues it; LINGER below lets ZMQ deliver it
        except zmq.ZMQError:
            pass
        sock.close(linger=1000)
