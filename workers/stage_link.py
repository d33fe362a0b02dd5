"""Hidden states between pipeline stages: each stage PUSHes its residual stream [T, dim] to the next stage's PULL.

A message is two frames: a msgpack header {shape, dtype} and the array's raw bytes (never pickle). Stages run
every plan in the same order, so the k-th array a stage receives is the k-th forward of its plans. Works over
ipc:// on one machine and tcp:// across machines (the address each stage listens on travels in the handshake).
With a worker secret, each message has a third frame sealing the first two and its number in the sequence
(protocol/worker_auth.py): anything else pushed at a stage's input is dropped, so tcp inputs take no stranger's data.
"""
import logging
import time

import msgpack
import numpy as np
import zmq

from tinyvllm.protocol.codec import MAX_MESSAGE_BYTES, MessageTooLarge
from tinyvllm.protocol.worker_auth import proof_matches, seal

log = logging.getLogger("tinyvllm.worker")

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
        self.inbox_key = self.outbox_key = None
        self.received = self.sent = 0  # messages, numbered in each seal
        self.transfer_s = 0.0  # sending, and receiving once the input is there (not the wait for it)

    def connect_next(self, address: str) -> None:
        """Where this stage sends (not called on the last stage)."""
        self.outbox = self.ctx.socket(zmq.PUSH)
        self.outbox.setsockopt(zmq.LINGER, 0)
        self.outbox.connect(address)

    def seal(self, inbox_key: bytes, outbox_key: bytes) -> None:
        """From now on accept only input sealed with inbox_key, and seal output with outbox_key."""
        self.inbox_key, self.outbox_key = inbox_key, outbox_key

    def _seal(self, key: bytes, number: int, header: bytes, payload) -> bytes:
        return seal(key, number.to_bytes(8, "little"), header, memoryview(payload).cast("B"))

    @property
    def address(self) -> str:
        """The bound address (a tcp port chosen by the system is resolved)."""
        return self.inbox.getsockopt_string(zmq.LAST_ENDPOINT) if self.inbox is not None else ""

    def send(self, x: np.ndarray) -> None:
        start = time.perf_counter()
        x = np.ascontiguousarray(x, np.float32)
        if x.nbytes > MAX_MESSAGE_BYTES:  # the next stage would drop it and wait forever: fail the step instead
            raise MessageTooLarge("hidden states", x.nbytes, MAX_MESSAGE_BYTES,
                                  ": lower --max-num-batched-tokens for this model's hidden size")
        header = msgpack.packb({"shape": list(x.shape), "dtype": "float32"})
        if not self.outbox.poll(self.timeout_ms, zmq.POLLOUT):
            raise TimeoutError("the next pipeline stage does not take its input")
        frames = [header, x]
        if self.outbox_key is not None:
            frames.append(self._seal(self.outbox_key, self.sent, header, x))
            self.sent += 1
        self.outbox.send_multipart(frames, copy=False)
        self.transfer_s += time.perf_counter() - start

    def recv(self) -> np.ndarray:
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            if not self.inbox.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                raise TimeoutError("no input from the previous pipeline stage")
            start = time.perf_counter()
            frames = self.inbox.recv_multipart()
            if self.inbox_key is None or self._sealed(frames):
                break
            log.warning("dropped a message at this stage's input that the previous stage did not seal")
        if len(frames) != (expected := 2 if self.inbox_key is None else 3):
            raise ValueError(f"a stage message has {expected} frames, got {len(frames)}")
        header = msgpack.unpackb(frames[0])
        shape, dtype = [int(n) for n in header["shape"]], _DTYPES[header["dtype"]]
        if np.prod(shape) * np.dtype(dtype).itemsize != len(frames[1]):
            raise ValueError(f"a stage message of shape {shape} has {len(frames[1])} bytes")
        x = np.frombuffer(frames[1], dtype).reshape(shape)
        self.transfer_s += time.perf_counter() - start
        return x

    def _sealed(self, frames: list[bytes]) -> bool:
        if len(frames) != 3 or not proof_matches(self._seal(self.inbox_key, self.received, *frames[:2]), frames[2]):
            return False
        self.received += 1
        return True

    def close(self) -> None:
        for sock in (self.inbox, self.outbox):
            if sock is not None:
                sock.close(0)
