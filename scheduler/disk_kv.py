"""The persistent prefix cache's scheduler side (--kv-cache-dir): which blocks go to disk and which come back.

The workers keep one file per block and rank (protocol/kv_disk_names.py; workers/kv_disk_store.py writes and checks
them); the scheduler keeps the index: the chain hashes every rank has a file for, least recently used first, with their
bytes, bounded by max_bytes (the least recently used files are deleted first).

Saving: a block that enters the in-memory prefix cache (KVCacheManager.newly_cached) and is not on disk goes into the
next plan's kv_disk_saves; the workers read it before that step and write its file in the background.

Loading: a waiting request whose cached prefix goes on with blocks on disk is not admitted yet. Fresh blocks, held
here, are filled from disk by the workers after this plan's step (kv_disk_loads); with its result the blocks that
loaded enter the prefix cache under their hashes and are let go (cached free), and those that failed (a missing,
corrupt or foreign file) leave the index and are deleted. The next schedule() then admits the request as an ordinary
prefix-cache hit, so a bad file costs a recompute, never a wrong token or a failed request. A request asks the disk once,
so blocks evicted again before it was admitted cannot keep it waiting.
"""
import os
from collections import OrderedDict
from dataclasses import dataclass

from tinyvllm.protocol.kv_disk_names import parse_block_file_name
from tinyvllm.protocol.messages import KVDiskBlock, StepResult
from tinyvllm.protocol.block_hash import BlockHash
from tinyvllm.scheduler.kv_cache_manager import KVCacheManager
from tinyvllm.scheduler.request import Request


@dataclass(slots=True)
class DiskLoad:
    """A block being filled from disk, and what it is registered under once it is."""
    block_id: int
    block_hash: BlockHash
    parent_hash: BlockHash
    token_ids: tuple[int, ...]
    first: bool  # a prompt's first block


def scan_disk_dir(path: str, world_size: int) -> list[tuple[BlockHash, int]]:
    """(chain hash, bytes of its files) of every block that each of the world_size ranks has a file for, least
    recently written first. Only names and sizes are read: the workers check a file's contents when they load it."""
    found: dict[BlockHash, tuple[set[int], int, float]] = {}
    try:
        entries = list(os.scandir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for entry in entries:
        parsed = parse_block_file_name(entry.name)
        if parsed is None or parsed[1] >= world_size:
            continue
        try:
            stat = entry.stat()
        except FileNotFoundError:
            continue
        ranks, size, mtime = found.get(parsed[0], (set(), 0, 0.0))
        found[parsed[0]] = (ranks | {parsed[1]}, size + stat.st_size, max(mtime, stat.st_mtime))
    complete = [(mtime, block_hash, size) for block_hash, (ranks, size, mtime) in found.items()
                if len(ranks) == world_size]
    return [(block_hash, size) for _, block_hash, size in sorted(complete)]


class DiskKV:
    def __init__(self, kv: KVCacheManager):
        self.kv = kv
        self.enabled = False
        self.index: OrderedDict[BlockHash, int] = OrderedDict()  # chain hash -> bytes on disk; front: evicted first
        self.num_bytes = self.max_bytes = self.block_bytes = 0
        self._loads: list[DiskLoad] = []  # for the plan being made
        self._in_flight: dict[int, tuple[list[DiskLoad], list[str]]] = {}  # step id -> its loads, requests waiting
        self._waiting: set[str] = set()  # requests that wait for a load (planned or in flight)
        self._new_waiting: list[str] = []  # those of the plan being made
        self._deletes: list[BlockHash] = []
        self.num_loaded_blocks = self.num_failed_blocks = 0  # cumulative

    def open(self, entries: list[tuple[BlockHash, int]], max_bytes: int, block_bytes: int) -> None:
        """Starts with the files found on disk (scan_disk_dir); block_bytes: a block's files, every rank's."""
        self.enabled, self.max_bytes, self.block_bytes = True, max_bytes, block_bytes
        self.kv.newly_cached = []
        for block_hash, size in entries:
            self.index[block_hash] = size
            self.num_bytes += size
        self._evict_over_bound()

    def holds_back(self, req: Request, cached_block_ids: list[int]) -> bool:
        """True when waiting req must not be admitted yet: the blocks that follow its cached prefix come from disk
        first (this plan loads them, or an earlier one does and its result is not in)."""
        if req.req_id in self._waiting:
            return True
        if not self.enabled or req.looked_up_disk or not self.kv.enable_caching or req.needs_every_position:
            return False
        req.looked_up_disk = True
        first, last = len(cached_block_ids), (req.num_tokens - 1) // self.kv.block_size  # as find_cached_prefix
        num = 0
        while first + num < last and req.block_hashes[first + num] in self.index:
            num += 1
        pool = self.kv.pool
        pool.hold(cached_block_ids)  # so that the loads do not evict the cached part of its prefix
        block_ids = pool.take_fresh(min(num, pool.num_free_blocks))
        pool.release(reversed(cached_block_ids))
        if not block_ids:
            return False
        for i, block_id in zip(range(first, first + len(block_ids)), block_ids):
            self._loads.append(DiskLoad(block_id, req.block_hashes[i], self.kv.parent_hash(req, i),
                                        self.kv.block_tokens(req, i), i == 0))
            self.index.move_to_end(req.block_hashes[i])
        self._waiting.add(req.req_id)
        self._new_waiting.append(req.req_id)
        return True

    def take_work(self, step_id: int) -> tuple[list[KVDiskBlock], list[BlockHash], list[KVDiskBlock]]:
        """(saves, deletes, loads) for plan step_id (made whenever any is non-empty)."""
        if not self.enabled:
            return [], [], []
        saves = []
        newly_cached, self.kv.newly_cached = self.kv.newly_cached, []
        for block_id, block_hash in newly_cached:
            if block_hash in self.index:
                self.index.move_to_end(block_hash)
            elif self.kv.pool.blocks[block_id].block_hash == block_hash:  # not evicted meanwhile
                saves.append(KVDiskBlock(block_id, block_hash))
                self.index[block_hash] = self.block_bytes
                self.num_bytes += self.block_bytes
        self._evict_over_bound()
        loads, self._loads = self._loads, []
        if loads:
            self._in_flight[step_id] = (loads, self._new_waiting)
            self._new_waiting = []
        deletes, self._deletes = self._deletes, []
        return saves, deletes, [KVDiskBlock(load.block_id, load.block_hash) for load in loads]

    def apply(self, result: StepResult) -> None:
        """The loaded blocks enter the prefix cache; the failed ones leave the index (their files are deleted)."""
        loads, req_ids = self._in_flight.pop(result.step_id, ([], []))
        failed = set(result.kv_disk_failed_block_ids)
        pool = self.kv.pool
        for load in loads:
            if load.block_id in failed:
                self.num_failed_blocks += 1
                self._forget(load.block_hash)
            else:
                self.num_loaded_blocks += 1
                pool.register(load.block_id, load.block_hash, load.parent_hash, load.token_ids, load.first)
        pool.release(reversed([load.block_id for load in loads]))  # the prefix's head is evicted last
        self._waiting.difference_update(req_ids)

    def block_tables(self) -> list[list[int]]:
        """The blocks held here (being loaded), for the pool's invariants."""
        return [[load.block_id for load in loads] for loads, _ in self._in_flight.values()] + \
            [[load.block_id for load in self._loads]]

    def _forget(self, block_hash: BlockHash) -> None:
        if (size := self.index.pop(block_hash, None)) is not None:
            self.num_bytes -= size
            self._deletes.append(block_hash)

    def _evict_over_bound(self) -> None:
        while self.index and self.num_bytes > self.max_bytes:
            self._forget(next(iter(self.index)))
