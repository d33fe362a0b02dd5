"""All-reduce and gather between the tensor-parallel worker processes of one host, through shared memory.

tinygrad has no collective between processes, so ranks exchange host arrays the way vLLM's CPU backend does:
one POSIX shared-memory segment per group, a slot per rank. Wake-ups block on ZMQ ipc sockets (each rank PULLs;
peers PUSH it the call's sequence number), never a busy spin: these machines often run more processes than cores.

A call: write my array into my slot, tell every peer, wait until every peer told me, then read. The segment has
two regions used by alternate calls; a rank writes region k % 2 for call k only after every peer announced call
k - 1, which each did after it had finished reading call k - 2, the last user of that region. Every rank sums in
rank order, so all ranks hold bit-identical results. Only numbers cross the sockets; numpy only, no tinygrad.
"""
import os
import tempfile
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import zmq


class HostGroup:
    """The ranks of one tensor-parallel group on one host."""

    def __init__(self, group_id: str, rank: int, size: int, max_bytes: int, timeout_s: float = 300.0):
        self.rank, self.size, self.max_bytes, self.timeout_s = rank, size, max_bytes, timeout_s
        self.calls = 0
        self.announced: dict[int, int] = {}  # peer rank -> the latest call it announced
        self.shm = self.ctx = None
        if size == 1:
            return
        self.shm = self._open_segment(group_id.replace("/", "_"), 2 * size * max_bytes)
        self.folder = os.path.join(tempfile.gettempdir(), f"{group_id}-collective")
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        self.ctx = zmq.Context()
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.bind(self._address(rank))
        self.peers = {}
        for peer in range(size):
            if peer != rank:
                sock = self.peers[peer] = self.ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(self._address(peer))

    def _address(self, rank: int) -> str:
        return f"ipc://{self.folder}/rank{rank}"

    def _open_segment(self, name: str, nbytes: int) -> shared_memory.SharedMemory:
        if self.rank == 0:
            return shared_memory.SharedMemory(name, create=True, size=nbytes)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                shm = shared_memory.SharedMemory(name)
                break
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {self.rank}: rank 0 did not create shared memory {name!r}")
                time.sleep(0.05)
        resource_tracker.unregister(shm._name, "shared_memory")  # rank 0 owns it: do not unlink at this exit
        return shm

    def _exchange(self, x: np.ndarray) -> list[np.ndarray]:
        """Every rank's array (same shape and dtype on all ranks), after every rank wrote its own."""
        x = np.ascontiguousarray(x)
        if x.nbytes > self.max_bytes:
            raise ValueError(f"an array of {x.nbytes} bytes is over this group's {self.max_bytes}")
        region = (self.calls % 2) * self.size * self.max_bytes
        self.calls += 1

        def slot(rank: int) -> np.ndarray:
            start = region + rank * self.max_bytes
            return np.frombuffer(self.shm.buf, x.dtype, x.size, start).reshape(x.shape)

        slot(self.rank)[...] = x
        announcement = np.array([self.rank, self.calls], np.int64).tobytes()
        for sock in self.peers.values():
            sock.send(announcement)
        deadline = time.monotonic() + self.timeout_s
        # a fast peer may already announce the next call while a slow one's announcement of this call is on its way
        while waiting := [p for p in self.peers if self.announced.get(p, 0) < self.calls]:
            if not self.inbox.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                raise TimeoutError(f"rank {self.rank}: no answer from rank(s) {waiting} within {self.timeout_s} s")
            peer, call = np.frombuffer(self.inbox.recv(), np.int64).tolist()
            self.announced[peer] = max(self.announced.get(peer, 0), call)
        return [slot(r) for r in range(self.size)]

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        """The elementwise sum over ranks, added in rank order on every rank."""
        if self.size == 1:
            return x
        parts = self._exchange(x)
        out = parts[0].copy()
        for part in parts[1:]:
            out += part
        return out

    def gather(self, x: np.ndarray, dst: int = 0) -> list[np.ndarray] | None:
        """On dst, every rank's array in rank order; None elsewhere (every rank still waits for all)."""
        if self.size == 1:
            return [x]
        parts = self._exchange(x)
        return [p.copy() for p in parts] if self.rank == dst else None

    def close(self) -> None:
        if self.shm is None:
            return
        for sock in (*self.peers.values(), self.inbox):
            sock.close(0)
        self.ctx.term()
        self.shm.close()
        if self.rank == 0:
            self.shm.unlink()
        try:
            os.unlink(self._address(self.rank)[len("ipc://"):])
            os.rmdir(self.folder)
        except OSError:
            pass  # a peer's socket file is still there: the last rank to close removes the folder
        self.shm = None
