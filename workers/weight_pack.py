"""A model's weights in their device layout, in a file that later starts map instead of rebuilding (--load-format).

Repacking a GGUF's blocks into the parts the kernels read (workers/quantized_weight.py) and copying them into device
memory took most of a model's load: 40 s of an 8B Q4_K_M's on a 2-core CPU. With a pack, the first start writes
each weight's parts into <cache>/weights/<key>.pack as it makes them, and every start maps that file: on the CPU
its pages become the weights' buffers (Tensor.from_blob), so nothing is copied, the memory is the page cache's
(shared by every worker that maps the pack, e.g. data-parallel replicas, and given back to the kernel when it needs
it), and a page is read from disk when first used. Elsewhere (GPUs) the mapped parts are copied to the device, still
without the repack.

The key: the model files' identity (path, size, modification time, inode), the worker's shard of them, the layout
choices (dtype, uint32 words, the C kernels' widening), this code's and the repacking code's digest, and the
machine's byte order. A pack is mapped read-only: a kernel that wrote into a weight would fault, not change it. The packs a directory
holds take at most MAX_CACHE_BYTES; the least recently used go first, and none is written where it would leave
less than its own size free.

File: the parts' bytes, each at a multiple of ALIGN, then the index (JSON: per weight its kind and its parts'
offset, numpy dtype and shape), then the index's length (8 bytes, little-endian) and MAGIC.
"""
from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import pathlib
import shutil
import sys
from typing import Callable

import numpy as np
from tinygrad import Device, Tensor
from tinygrad.dtype import _from_np_dtype

from tinyvllm.workers.captured_steps import cache_root, stat_if_present
from tinyvllm.workers.device_input import device_tensor
from tinyvllm.workers.quantized_weight import DeviceWeight

log = logging.getLogger("tinyvllm.worker")
MAGIC = b"TVPACK01"
ALIGN = 4096  # page-aligned parts: any kernel's vector loads are aligned, as in a freshly allocated buffer
MAX_CACHE_BYTES = 64 << 30
AUTO_MIN_BYTES = 1 << 30  # --load-format auto packs models whose weight files are at least this large
_SOURCES = [pathlib.Path(__file__).with_name(name) for name in ("weight_pack.py", "quantized_weight.py",
                                                                 "gguf_dequantize.py", "weights.py", "fp8_checkpoint.py",
                                                                 "tensor_parallel.py")]

HostParts = Callable[[str, object], tuple[str, tuple[np.ndarray, ...]]]  # (name, host weight) -> (kind, parts)


def model_files(model: pathlib.Path) -> list[pathlib.Path]:
    return [model] if model.is_file() else sorted(p for p in model.iterdir() if p.suffix in (".safetensors", ".json"))


def pack_directory() -> pathlib.Path:
    """Beside the captured steps: ~/.cache/tinyvllm/weights (the tests' run directory in the tests)."""
    return cache_root().parent / "weights"


def uses_pack(load_format: str, model: pathlib.Path) -> bool:
    """--load-format: "packed" always, "direct" never, "auto" for models of AUTO_MIN_BYTES or more."""
    return load_format == "packed" or (load_format == "auto"
                                       and sum(p.stat().st_size for p in model_files(model)) >= AUTO_MIN_BYTES)


class WeightPack:
    """The packs of one model (and shard) in `directory`; `device_weights` maps or writes the one of a layout."""

    def __init__(self, directory: pathlib.Path, model: pathlib.Path, shard: object = None):
        self.directory = directory
        files = [(str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)
                 for p in model_files(model) for st in [p.stat()]]
        self.identity = {"files": files, "shard": repr(shard), "byteorder": sys.byteorder,
                         "code": hashlib.sha256(b"".join(p.read_bytes() for p in _SOURCES)).hexdigest()}
        self.mapped: mmap.mmap | None = None  # the mapping the weights' buffers point into: lives as long as this

    def path(self, layout: dict) -> pathlib.Path:
        key = hashlib.sha256(json.dumps({**self.identity, **layout}, sort_keys=True).encode()).hexdigest()[:32]
        return self.directory / f"{key}.pack"

    def device_weights(self, weights: dict, layout: dict, host_parts: HostParts) -> dict[str, DeviceWeight] | None:
        """{name: DeviceWeight} of `weights`, from the pack of `layout` (written first if there is none); None where
        it could not be written (the caller loads the weights without it)."""
        path = self.path(layout)
        index = self._read_index(path, set(weights))
        if index is None:
            if not self._write(path, weights, host_parts):
                return None
            index = self._read_index(path, set(weights))
            assert index is not None, f"{path} was just written"
        os.utime(path)  # its last use, for the eviction
        with open(path, "rb") as f:
            self.mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        self.mapped.madvise(mmap.MADV_WILLNEED)  # read ahead now, in the background, not at the first step's faults
        data = np.frombuffer(self.mapped, np.uint8)
        on_host = Device.DEFAULT.split(":")[0] == "CPU"
        out = {}
        for name, (kind, parts) in index.items():
            arrays = [data[off:off + np.dtype(dt).itemsize * int(np.prod(shape))].view(dt).reshape(shape)
                      for off, dt, shape in parts]
            out[name] = DeviceWeight(kind, tuple(_mapped_tensor(a) if on_host else device_tensor(a) for a in arrays))
        return out

    def _read_index(self, path: pathlib.Path, names: set[str]) -> dict | None:
        """The pack's index, if the file is a whole pack of exactly these weights (else it goes: rewritten)."""
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(size - 16)
                tail = f.read(16)
                length = int.from_bytes(tail[:8], "little")
                if tail[8:] != MAGIC or length > size - 16:
                    raise ValueError("no pack trailer")
                f.seek(size - 16 - length)
                index = json.loads(f.read(length))
            if set(index) != names:
                raise ValueError("other weights")
            for _, parts in index.values():
                for off, dt, shape in parts:
                    if off % ALIGN or off + np.dtype(dt).itemsize * int(np.prod(shape)) > size - 16 - length:
                        raise ValueError("a part outside the file")
            return index
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, json.JSONDecodeError) as e:
            log.warning("weight pack %s unreadable (%s): writing it again", path, e)
            path.unlink(missing_ok=True)
            return None

    def _write(self, path: pathlib.Path, weights: dict, host_parts: HostParts) -> bool:
        """Writes the pack one weight at a time (no second copy of the model in memory); False (and nothing
        written) where the disk has too little room or the write fails."""
        need = sum(_nbytes(w) for w in weights.values())
        self.directory.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(self.directory).free < 2 * need:
            log.warning("weight pack not written: %s has less than twice the weights' %.1f GB free",
                        self.directory, need / 1e9)
            return False
        _evict(self.directory, MAX_CACHE_BYTES - need)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        index = {}
        try:
            with open(tmp, "wb") as f:
                for name, w in weights.items():
                    kind, parts = host_parts(name, w)
                    entries = []
                    for part in parts:
                        f.seek(-f.tell() % ALIGN, os.SEEK_CUR)
                        entries.append((f.tell(), part.dtype.str, list(part.shape)))
                        f.write(np.ascontiguousarray(part).data)
                    index[name] = (kind, entries)
                encoded = json.dumps(index).encode()
                f.write(encoded + len(encoded).to_bytes(8, "little") + MAGIC)
            os.replace(tmp, path)  # atomic: workers of one setup may write it at the same time
            return True
        except OSError as e:
            log.warning("weight pack %s not written (%s): loading without it", path, e)
            return False
        finally:
            tmp.unlink(missing_ok=True)


def _nbytes(w) -> int:
    """About the bytes of a host weight's parts (a QuantizedArray's blocks, or the array's)."""
    return w.blocks.nbytes if hasattr(w, "blocks") else np.asarray(w).nbytes


def _mapped_tensor(array: np.ndarray) -> Tensor:
    """A CPU tensor whose buffer is `array`'s memory (the mapped pack's pages)."""
    if array.size == 0 or array.ndim == 0:
        return device_tensor(array)
    return Tensor.from_blob(array.ctypes.data, array.shape, dtype=_from_np_dtype(array.dtype), device=Device.DEFAULT)


def _evict(directory: pathlib.Path, budget: int) -> None:
    """Deletes the least recently used packs until the rest take at most `budget` bytes."""
    packs = sorted((st.st_mtime, st.st_size, p) for p in directory.glob("*.pack") if (st := stat_if_present(p)) is not None)
    total = sum(size for _, size, _ in packs)
    for _, size, pack in packs:
        if total <= budget:
            break
        total -= size
        pack.unlink(missing_ok=True)
        log.info("weight pack %s deleted (least recently used)", pack.name)
