"""A model's weights in their device layout, in a file that later starts map instead of rebuilding (--load-format).

Repacking a GGUF's blocks into the parts the kernels read (workers/quantized_weight.py) and copying them into device
memory took most of a model's load: 40 s of an 8B Q4_K_M's on a 2-core CPU. With a pack, the first start writes
each weight's parts into <cache>/weights/<key>.pack as it makes them, and every start maps that file read-only: on
the CPU its pages become the weights' buffers (Tensor.from_blob; each buffer keeps a view of the mapping, so the
pages stay mapped as long as any buffer lives), so nothing is copied, the memory is the page cache's (shared by every
worker that maps the pack) and a page is read from disk when first used. Elsewhere (GPUs) the mapped parts are copied
to the device, still without the repack.

The key: the model files' identity (path, size, modification and change times, inode), the worker's shard, the
layout choices (dtype, uint32 words, the C kernels' widening), every source file of workers/ and protocol/ (the
repacking, the GGUF reader, the model config, the sharding) and the tinyvllm version, and the byte order; a pack
whose weights' shapes are not the model's is not used. Workers that need the same pack take turns (a lock file):
one writes, the others map what it wrote. The packs of a directory take at most MAX_CACHE_BYTES, the least recently
used deleted first (and a writer's leftover from a crash); a pack is only written while the disk keeps
FREE_MARGIN_BYTES free. Any failure to read, write or map a pack (an unwritable cache directory, a full disk, a
damaged file) logs a warning and loads the weights directly.

File: the parts' bytes, each at a multiple of ALIGN, then the index (JSON: per weight its kind and its parts'
offset, numpy dtype and shape), then the index's length (8 bytes, little-endian) and MAGIC.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import os
import pathlib
import shutil
import sys
import time
from typing import Callable

import numpy as np
from tinygrad import Device, Tensor
from tinygrad.dtype import _from_np_dtype

import tinyvllm
from tinyvllm.workers.captured_steps import cache_root, stat_if_present
from tinyvllm.workers.device_input import device_tensor
from tinyvllm.workers.quantized_weight import DeviceWeight

log = logging.getLogger("tinyvllm.worker")
MAGIC = b"TVPACK01"
ALIGN = 4096  # page-aligned parts: any kernel's vector loads are aligned, as in a freshly allocated buffer
MAX_CACHE_BYTES = 64 << 30
FREE_MARGIN_BYTES = 2 << 30  # a pack stops being written (and is not used) where the disk would keep less free
AUTO_MIN_BYTES = 1 << 30  # --load-format auto packs models whose weight files take at least this (1 GiB)
STALE_TMP_S = 24 * 3600  # a writer's temporary file this old is a crash's leftover even if its pid was reused
_PACKAGE = pathlib.Path(__file__).resolve().parent.parent  # the folder holding workers/ and protocol/ (not
                                                           # tinyvllm/__init__.py's: a checkout keeps them beside it)

HostParts = Callable[[str, object], tuple[str, tuple[np.ndarray, ...]]]  # (name, host weight) -> (kind, parts)


def model_files(model: pathlib.Path) -> list[pathlib.Path]:
    return [model] if model.is_file() else sorted(p for p in model.iterdir() if p.suffix in (".safetensors", ".json"))


def pack_directory() -> pathlib.Path:
    """Beside the captured steps: ~/.cache/tinyvllm/weights ($XDG_CACHE_HOME/tinyvllm/weights; in the tests, their
    run's directory)."""
    return cache_root().parent / "weights"


def uses_pack(load_format: str, model: pathlib.Path) -> bool:
    """--load-format: "packed" always, "direct" never, "auto" for models of AUTO_MIN_BYTES or more."""
    return load_format == "packed" or (load_format == "auto"
                                       and sum(p.stat().st_size for p in model_files(model)) >= AUTO_MIN_BYTES)


def code_files() -> list[pathlib.Path]:
    """The sources a pack's layout comes from (the repacking, the GGUF reader, the model config, the sharding)."""
    return sorted(p for folder in ("workers", "protocol") for p in (_PACKAGE / folder).glob("*.py"))


def _code_digest() -> str:
    digest = hashlib.sha256(tinyvllm.__version__.encode())
    for path in code_files():
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


class WeightPack:
    """The packs of one model (and shard) in `directory`; `device_weights` maps or writes the one of a layout."""

    def __init__(self, directory: pathlib.Path, model: pathlib.Path, shard: object = None):
        self.directory = directory
        files = [(str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
                 for p in model_files(model) for st in [p.stat()]]
        self.identity = {"files": files, "shard": repr(shard), "byteorder": sys.byteorder, "code": _code_digest()}

    def path(self, layout: dict) -> pathlib.Path:
        key = hashlib.sha256(json.dumps({**self.identity, **layout}, sort_keys=True).encode()).hexdigest()[:32]
        return self.directory / f"{key}.pack"

    def device_weights(self, weights: dict, layout: dict, host_parts: HostParts) -> dict[str, DeviceWeight] | None:
        """{name: DeviceWeight} of `weights`, from the pack of `layout` (written first if there is none); None where
        there is no pack to use (the caller loads the weights directly)."""
        path = self.path(layout)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(path.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one worker writes, the others wait and map what it wrote
                out = self._map(path, weights)
                if out is None and self._write(path, weights, host_parts):
                    out = self._map(path, weights)
            return out
        except OSError as e:
            log.warning("weight pack %s not used (%s): loading the weights directly", path, e)
            return None

    def _map(self, path: pathlib.Path, weights: dict) -> dict[str, DeviceWeight] | None:
        """The pack's weights, if the file is a whole pack of exactly these weights (else it goes)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            mapped = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            os.utime(fd)  # its last use, for the eviction
        except (OSError, ValueError) as e:  # ValueError: an empty file
            os.close(fd)
            return self._discard(path, e)
        os.close(fd)  # the mapping stays
        try:
            length = int.from_bytes(mapped[size - 16:size - 8], "little")
            if mapped[size - 8:] != MAGIC or length > size - 16:
                raise ValueError("no pack trailer")
            index = json.loads(mapped[size - 16 - length:size - 16])
            if set(index) != set(weights):
                raise ValueError("other weights")
            data = np.frombuffer(mapped, np.uint8, size - 16 - length)
            on_host = Device.DEFAULT.split(":")[0] == "CPU"
            out = {}
            for name, (kind, parts) in index.items():
                arrays = []
                for off, dt, shape in parts:
                    end = off + np.dtype(dt).itemsize * int(np.prod(shape))
                    if off % ALIGN or end > len(data):
                        raise ValueError("a part outside the file")
                    arrays.append(data[off:end].view(dt).reshape(shape))
                out[name] = DeviceWeight(kind, tuple(_mapped_tensor(a) if on_host else device_tensor(a)
                                                     for a in arrays))
                if out[name].shape != tuple(weights[name].shape):
                    raise ValueError(f"{name} is {out[name].shape}, not {tuple(weights[name].shape)}")
        except (ValueError, TypeError, KeyError, json.JSONDecodeError) as e:
            return self._discard(path, e)
        mapped.madvise(mmap.MADV_WILLNEED)  # read ahead now, in the background, not at the first step's faults
        return out

    @staticmethod
    def _discard(path: pathlib.Path, error: Exception) -> None:
        log.warning("weight pack %s unusable (%s): writing it again", path, error)
        path.unlink(missing_ok=True)
        return None

    def _write(self, path: pathlib.Path, weights: dict, host_parts: HostParts) -> bool:
        """Writes the pack one weight at a time (no second copy of the model in memory); False (nothing written)
        where the disk would keep less than FREE_MARGIN_BYTES free or the pack would pass MAX_CACHE_BYTES."""
        _evict(self.directory, MAX_CACHE_BYTES - sum(_nbytes(w) for w in weights.values()))
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        index = {}
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                for name, w in weights.items():
                    kind, parts = host_parts(name, w)
                    room = shutil.disk_usage(self.directory).free - FREE_MARGIN_BYTES
                    if sum(p.nbytes + ALIGN for p in parts) > room or f.tell() > MAX_CACHE_BYTES:
                        log.warning("weight pack not written: %s would keep less than %.0f GB free, or the pack "
                                    "would pass %.0f GB", self.directory, FREE_MARGIN_BYTES / 1e9, MAX_CACHE_BYTES / 1e9)
                        return False
                    entries = []
                    for part in parts:
                        f.seek(-f.tell() % ALIGN, os.SEEK_CUR)
                        entries.append((f.tell(), part.dtype.str, list(part.shape)))
                        f.write(np.ascontiguousarray(part).data)
                    index[name] = (kind, entries)
                encoded = json.dumps(index).encode()
                f.write(encoded + len(encoded).to_bytes(8, "little") + MAGIC)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            return True
        finally:
            tmp.unlink(missing_ok=True)


def _nbytes(w) -> int:
    """About the bytes of a host weight's parts (a QuantizedArray's blocks, or the array's)."""
    return w.blocks.nbytes if hasattr(w, "blocks") else np.asarray(w).nbytes


def _mapped_tensor(array: np.ndarray) -> Tensor:
    """A CPU tensor whose buffer is `array`'s memory (the mapped pack's pages); the buffer keeps the array, and with
    it the mapping, alive."""
    if array.size == 0 or array.ndim == 0:
        return device_tensor(array)
    t = Tensor.from_blob(array.ctypes.data, array.shape, dtype=_from_np_dtype(array.dtype), device=Device.DEFAULT)
    t.uop.buffer.pack_pages = array
    return t


def _evict(directory: pathlib.Path, budget: int) -> None:
    """Deletes crashed writers' temporary files, then the least recently used packs until the rest take at most
    `budget` bytes."""
    for tmp in directory.glob("*.tmp*"):
        pid = tmp.suffix[len(".tmp"):]
        if (st := stat_if_present(tmp)) is not None and (not _alive(pid) or time.time() - st.st_mtime > STALE_TMP_S):
            tmp.unlink(missing_ok=True)
    packs = sorted((st.st_mtime, st.st_size, p) for p in directory.glob("*.pack") if (st := stat_if_present(p)) is not None)
    total = sum(size for _, size, _ in packs)
    for _, size, pack in packs:
        if total <= budget:
            break
        total -= size
        pack.unlink(missing_ok=True)
        log.info("weight pack %s deleted (least recently used)", pack.name)


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True
