"""All-reduce and gather between the tensor-parallel worker processes of one host, through shared memory.

tinygrad has no collective between processes, so ranks exchange host arrays as vLLM's CPU backend does: one POSIX
shared-memory segment per group (rank 0 creates it), two regions of a slot per rank. A call: write my array into
my slot of region call % 2, write "rank, call number" (two integers, never a pickle) into every peer's named pipe
(FIFO), block in epoll/kqueue (never spin: these machines run more processes than cores) until every peer has
announced the call, read the slots, adding in rank order 0..size-1: bit-identical everywhere. FIFOs, not ZMQ: no
I/O thread in between, half the time for a small call (35 vs 85 us, 2 cores). Limits: every rank passes the same
shape and dtype, at most max_bytes; a hung or dead peer is a TimeoutError after timeout_s (a ConnectionError once
its pipe is gone), leaving the group unusable; the segment takes 2 * size * max_bytes of /dev/shm. Numpy only.
"""
import errno
import os
import selectors
import shutil
import struct
import tempfile
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np

ANNOUNCEMENT = struct.Struct("<qq")  # (rank, call number): 16 bytes, under PIPE_BUF, so every write is atomic


def _attach(name: str) -> shared_memory.SharedMemory:
    """Attach unregistered with the resource tracker: Python < 3.13 would unlink the creator's segment when this
    process exits, or, unregistered afterwards, drop the creator's registration in a shared one (cpython#82300)."""
    register, resource_tracker.register = resource_tracker.register, lambda *args: None
    try:
        return shared_memory.SharedMemory(name)
    finally:
        resource_tracker.register = register


class HostGroup:
    """The ranks of one tensor-parallel group on one host."""

    def __init__(self, group_id: str, rank: int, size: int, max_bytes: int, timeout_s: float = 300.0):
        if not (0 <= rank < size and max_bytes > 0):
            raise ValueError(f"rank {rank} of {size} ranks with max_bytes {max_bytes}")
        self.rank, self.size, self.max_bytes, self.timeout_s = rank, size, max_bytes, timeout_s
        self.calls, self.announced = 0, [0] * size  # announced: by rank, the latest call that rank announced
        self.shm, self.peers, self.busy_s = None, [], 0.0  # busy_s: seconds in all_reduce and gather, waits included
        if size == 1:
            return
        name, nbytes = group_id.replace("/", "_"), 2 * size * max_bytes
        if rank == 0:  # a /dev/shm too small is a SIGBUS on first touch, with no message: say so here
            if os.path.isdir("/dev/shm") and (fs := os.statvfs("/dev/shm")).f_bavail * fs.f_frsize < nbytes:
                raise MemoryError(f"/dev/shm has less than the {nbytes} bytes this group needs (docker: --shm-size)")
            self.shm = shared_memory.SharedMemory(name, create=True, size=nbytes)
        else:
            self.shm = self._until(time.monotonic() + timeout_s, lambda: _attach(name), "shared memory from rank 0")
            if self.shm.size < nbytes:
                raise ValueError(f"rank {rank}: {self.shm.size} bytes of shared memory, not {nbytes}: same max_bytes?")
        self.folder = os.path.join(tempfile.gettempdir(), f"{name}-collective")
        self.fifos = [os.path.join(self.folder, f"rank{r}") for r in range(size)]
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        os.mkfifo(self.fifos[rank], 0o600)
        self.inbox = os.open(self.fifos[rank], os.O_RDWR | os.O_NONBLOCK)  # holding a write end too: never an EOF
        self.poller = selectors.DefaultSelector()  # epoll, kqueue on macOS
        self.poller.register(self.inbox, selectors.EVENT_READ)
        self.others = [peer for peer in range(size) if peer != rank]

    def _until(self, deadline: float, attempt, what: str):
        """attempt() until the deadline while what it opens is not there yet."""
        while True:
            try:
                return attempt()
            except (OSError, ValueError) as e:  # ENXIO: a FIFO its rank has not opened; ValueError: an empty segment
                if getattr(e, "errno", errno.ENOENT) not in (errno.ENOENT, errno.ENXIO):
                    raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {self.rank}: no {what} within {self.timeout_s} s") from None
                time.sleep(0.01)

    def _exchange(self, x: np.ndarray) -> list[np.ndarray]:
        """Every rank's array (same shape and dtype on all ranks), views into the segment valid for this call."""
        x = np.ascontiguousarray(x)
        if x.nbytes > self.max_bytes:
            raise ValueError(f"an array of {x.nbytes} bytes ({x.shape} {x.dtype}) is over this group's max_bytes "
                             f"of {self.max_bytes}")
        deadline = time.monotonic() + self.timeout_s
        while len(self.peers) < len(self.others):  # the first call opens the peers' FIFOs, there once they start
            peer = self.others[len(self.peers)]
            open_fifo = lambda: os.open(self.fifos[peer], os.O_WRONLY | os.O_NONBLOCK)  # noqa: E731
            self.peers.append(self._until(deadline, open_fifo, f"answer from rank {peer}"))
        # Double buffering: call k writes region k % 2, last read by call k - 2. A rank starts call k only after
        # every peer announced call k - 1, and a peer announces k - 1 only after it returned from k - 2, reading
        # included; so no rank overwrites what a slower one may still be reading.
        region = (self.calls % 2) * self.size * self.max_bytes
        self.calls += 1

        def slot(rank: int) -> np.ndarray:  # a view: none may outlive the call (shm.close() refuses while one lives)
            return np.frombuffer(self.shm.buf, x.dtype, x.size, region + rank * self.max_bytes).reshape(x.shape)

        slot(self.rank)[...] = x
        for fd in self.peers:
            os.write(fd, ANNOUNCEMENT.pack(self.rank, self.calls))  # BrokenPipeError (a ConnectionError): it exited
        # a fast peer may have announced the next call already (never further: that needs our announcement)
        while waiting := [r for r in self.others if self.announced[r] < self.calls]:
            if not self.poller.select(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"rank {self.rank}: no answer from rank(s) {waiting} within {self.timeout_s} s")
            for peer, call in ANNOUNCEMENT.iter_unpack(os.read(self.inbox, 256 * ANNOUNCEMENT.size)):
                self.announced[peer] = max(self.announced[peer], call)
        return [slot(r) for r in range(self.size)]

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        """The elementwise sum over ranks, added in rank order on every rank (bit-identical everywhere)."""
        if self.size == 1:
            return x
        start = time.perf_counter()
        parts = self._exchange(x)
        out = parts[0] + parts[1]
        for part in parts[2:]:
            out += part
        self.busy_s += time.perf_counter() - start
        return out

    def gather(self, x: np.ndarray, dst: int = 0) -> list[np.ndarray] | None:
        """On dst, every rank's array in rank order; None elsewhere (every rank still waits for all)."""
        if self.size == 1:
            return [x]
        start = time.perf_counter()
        parts = self._exchange(x)
        out = [p.copy() for p in parts] if self.rank == dst else None
        self.busy_s += time.perf_counter() - start
        return out

    def close(self) -> None:
        """Idempotent. Rank 0 (the creator) unlinks the segment and removes the folder of FIFOs."""
        shm, self.shm = self.shm, None
        if shm is None:
            return
        self.poller.close()
        for fd in (*self.peers, self.inbox):
            os.close(fd)
        shm.close()
        if self.rank == 0:  # the other ranks' FIFOs too: then or later, none is opened again
            shm.unlink()
            shutil.rmtree(self.folder, ignore_errors=True)
