"""Ending a KV lease from the decode side: a KVRelease to a prefill engine's side channel (workers/kv_side_channel.py),
sent by a decode worker after its pull, or by a decode scheduler for a request that ended before its pull (say, its
client went away), so that the prefill instance's blocks go back to its pool now rather than when the lease runs out.
"""
import zmq

from tinyvllm.protocol.codec import encode
from tinyvllm.protocol.kv_auth import new_nonce, release_mac
from tinyvllm.protocol.messages import KVRelease, KVTransferParams
from tinyvllm.protocol.transport import make_socket


def endpoint_of(remote: KVTransferParams, prefill_rank: int) -> str:
    """Rank q of a prefill engine serves its side channel at remote_port + q."""
    return f"tcp://{remote.remote_host}:{remote.remote_port + prefill_rank}"


def release_remote_kv(ctx: zmq.Context, remote: KVTransferParams, secret: str = "") -> None:
    """To every rank of the prefill engine."""
    for rank in range(max(1, remote.tp_size)):
        send_release(make_socket(ctx, zmq.DEALER, endpoint_of(remote, rank), bind=False), remote.remote_request_id,
                     secret)


def send_release(sock: zmq.Socket, request_id: str, secret: str, num_releases: int = 1) -> None:
    """Sends a KVRelease on a DEALER connected to a side channel and closes it: ZMQ delivers it within LINGER if
    anyone listens there, in the background. num_releases: how many releases end the lease there (1: this one)."""
    nonce = new_nonce()
    try:
        sock.send(encode(KVRelease(request_id, nonce, release_mac(secret, request_id, nonce, num_releases),
                                   num_releases)), zmq.NOBLOCK)
    except zmq.ZMQError:
        pass
    sock.close(linger=1000)
