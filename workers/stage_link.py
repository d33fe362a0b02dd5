"""Hidden states between pipeline stages: each stage PUSHes its residual stream [T, dim] to the next stage's PULL.

A message is two frames: a msgpack header {shape, dtype} and the array's raw bytes (never pickle). Stages run
every plan in the same order, so the k-th array a stage receives is the k-th forward of its plans. Works over
ipc:// on one machine and tcp:// across machines (the address each stage listens on travels in the handshake).
"""
import msgpack
import numpy as np
import zmq

from tinyvllm.protocol.codec import MAX_MESSAGE_BYTES

_DTYPES = {"float32": np.float32}


class StageLink:
    def __init__(self, ctx: zmq.Context, listen_address: str | None, timeout_s: float = 600.0):
        """listen_address: where this stage receives (None on the first stage)."""
        self.timeout_ms = int(timeout_s * 1000)
        self.inbox = None
        self.outbox = None
        if listen_address:
            self.inbox = ctx.socket(zmq.PULL)
            self.inbox.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            self.inbox.setsockopt(zmq.LINGER, 0)
            self.inbox.bind(listen_address)
        self.ctx = ctx

    def connect_next(self, address: str) -> None:
        """Where this stage sends (not called on the last stage)."""
        self.outbox = self.ctx.socket(zmq.PUSH)
        self.outbox.setsockopt(zmq.LINGER, 0)
        self.outbox.connect(address)

    @property
    def address(self) -> str:
        """The bound address (a tcp port chosen by the system is resolved)."""
        return self.inbox.getsockopt_string(zmq.LAST_ENDPOINT) if self.inbox is not None else ""

    def send(self, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, np.float32)
        header = msgpack.packb({"shape": list(x.shape), "dtype": "float32"})
        if not self.outbox.poll(self.timeout_ms, zmq.POLLOUT):
            raise TimeoutError("the next pipeline stage does not take its input")
        self.outbox.send_multipart([header, x], copy=False)

    def recv(self) -> np.ndarray:
        if not self.inbox.poll(self.timeout_ms):
            raise TimeoutError("no input from the previous pipeline stage")
        frames = self.inbox.recv_multipart()
        if len(frames) != 2:
            raise ValueError(f"a stage message has 2 frames, got {len(frames)}")
        header = msgpack.unpackb(frames[0])
        shape, dtype = [int(n) for n in header["shape"]], _DTYPES[header["dtype"]]
        if np.prod(shape) * np.dtype(dtype).itemsize != len(frames[1]):
            raise ValueError(f"a stage message of shape {shape} has {len(frames[1])} bytes")
        return np.frombuffer(frames[1], dtype).reshape(shape)

    def close(self) -> None:
        for sock in (self.inbox, self.outbox):
            if sock is not None:
                sock.close(0)
