"""A worker's part in the persistent prefix cache (--kv-cache-dir; the scheduler's part is scheduler/disk_kv.py).

Before a step: the plan's kv_disk_saves are read from the cache on this (the main) thread, since the step may reuse
those blocks, and a background thread writes each file (a temporary file, then an atomic rename) and performs the
plan's deletes, in plan order. After the step: the plan's kv_disk_loads are read and checked (workers/kv_disk_file.py)
and written into their blocks; a missing, truncated, corrupt or foreign file is not loaded: it is logged and reported
in the result (tensor-parallel ranks agree first, so that no rank keeps a block another could not fill).
Writes that fall behind are dropped past a bound (the scheduler then finds no file, and recomputes).
"""
import logging
import os
import queue
import threading

import numpy as np

from tinyvllm.protocol.kv_disk_names import block_file_name, layout_dir_name
from tinyvllm.protocol.messages import StepPlan, StepResult
from tinyvllm.workers.kv_disk_file import HEADER_BYTES, BlockFileKey, KVDiskFileError, decode_block_file, \
    encode_block_file

log = logging.getLogger("tinyvllm.worker")
MAX_PENDING_WRITE_BYTES = 512 * 1024 * 1024  # block files waiting for the writer thread, at most
CLOSE_TIMEOUT_S = 60.0  # how long a stopping worker waits for its pending writes


class KVDiskStore:
    def __init__(self, root: str, key: BlockFileKey, block_io, group=None):
        """block_io: workers/kv_block_io.py's KVBlockIO; group: the tensor-parallel group (None: one rank)."""
        self.key, self.block_io, self.group = key, block_io, group
        self.dir = os.path.join(os.path.abspath(root), layout_dir_name(key.compat_hash, key.tp_size, key.pp_size))
        os.makedirs(self.dir, exist_ok=True)
        self._remove_stale_temporary_files()
        for _ in range(2):  # TinyJit captures on the second call: the first load after a restart should not compile
            block_io.write(0, block_io.read(0))
        self.file_bytes = HEADER_BYTES + block_io.nbytes
        self._pending: dict[str, bytes] = {}  # path -> file contents not written yet (a load may need them)
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_files, name="kv-disk-writer", daemon=True)
        self._writer.start()
        self.num_dropped = 0

    def _remove_stale_temporary_files(self) -> None:
        """What an earlier process of this rank left half-written (killed mid-write): only this rank writes them."""
        mine = f".r{self.key.rank}.kv."
        for name in os.listdir(self.dir):
            if mine in name and name.endswith(".tmp"):
                try:
                    os.unlink(os.path.join(self.dir, name))
                except OSError:
                    pass

    def path(self, block_hash: bytes) -> str:
        return os.path.join(self.dir, block_file_name(block_hash, self.key.rank))

    # ---- before the step -----------------------------------------------------------------------------

    def save(self, plan: StepPlan) -> None:
        for save in plan.kv_disk_saves:
            path = self.path(save.block_hash)
            with self._lock:
                if self._pending_bytes + self.file_bytes > MAX_PENDING_WRITE_BYTES:
                    self.num_dropped += 1
                    if self.num_dropped in (1, 10, 100) or self.num_dropped % 1000 == 0:
                        log.warning("rank %d: the KV cache folder's writes fall behind: %d blocks not saved",
                                    self.key.rank, self.num_dropped)
                    continue
            data = encode_block_file(self.key, save.block_hash, self.block_io.read(save.block_id))
            with self._lock:
                self._pending_bytes += len(data) - len(self._pending.get(path, b""))
                self._pending[path] = data
            self._queue.put(("write", path, data))
        for block_hash in plan.kv_disk_deletes:
            self._queue.put(("delete", self.path(block_hash), None))

    def _write_files(self) -> None:
        while (item := self._queue.get()) is not None:
            op, path, data = item
            try:
                if op == "write":
                    tmp = f"{path}.{os.getpid()}.tmp"
                    with open(tmp, "wb") as f:
                        f.write(data)
                    os.replace(tmp, path)
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("rank %d: KV cache folder: could not %s %s: %s", self.key.rank, op, path, e)
            finally:
                if op == "write":
                    with self._lock:
                        if self._pending.get(path) is data:
                            del self._pending[path]
                            self._pending_bytes -= len(data)

    # ---- after the step ------------------------------------------------------------------------------

    def load(self, plan: StepPlan, result: StepResult) -> None:
        if not plan.kv_disk_loads:
            return
        failed = np.zeros(len(plan.kv_disk_loads), np.float32)
        for i, load in enumerate(plan.kv_disk_loads):
            try:
                self.block_io.write(load.block_id, self._read(load.block_hash))
            except (OSError, KVDiskFileError) as e:
                log.warning("rank %d: KV cache file %s not loaded: %s", self.key.rank, self.path(load.block_hash), e)
                failed[i] = 1
        if self.group is not None:
            failed = self.group.all_reduce(failed)
        result.kv_disk_failed_block_ids += [load.block_id for load, bad in zip(plan.kv_disk_loads, failed) if bad]

    def _read(self, block_hash: bytes) -> bytes:
        path = self.path(block_hash)
        with self._lock:
            data = self._pending.get(path)
        if data is None:
            with open(path, "rb") as f:
                data = f.read(self.file_bytes + 1)  # one byte more than a good file: a longer one is refused
        return decode_block_file(data, self.key, block_hash, self.block_io.nbytes)

    def close(self) -> None:
        """Waits (a bounded time) for the pending writes."""
        self._queue.put(None)
        self._writer.join(CLOSE_TIMEOUT_S)
