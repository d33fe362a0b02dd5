"""Captured forward steps kept on disk, so that a restart serves at once instead of capturing its buckets again.

Capturing a bucket's step (tracing the model, scheduling it, linearising ~600 kernels) costs seconds per bucket
even when every kernel's binary comes from tinygrad's disk cache; that, not the model load, kept a restart from
its first token. A captured step (tinygrad's CapturedJit: the scheduled, compiled kernels and the buffers they
use) is pickled per jit (a token bucket's forward, a sampler variant of a row bucket) into
<cache>/tinyvllm/captured-steps/<key>/<name>.pkl, except its buffers:
the model's weights and the KV cache are written as their names (pickle's persistent ids) and bound to this
process's own on load; buffers the step writes itself (its intermediates) get fresh ones. A step that reads any
other buffer is not saved, since that buffer's contents would be lost.

The key hashes what a step depends on: the model's fingerprint and config, the runner's shapes (buckets,
sequences, context, blocks, KV dtype), the kernel set, device, CPU, environment knobs, and the tinyvllm and
tinygrad versions: a changed setup finds no file and captures afresh. Pickle runs code on load: these files are
only read from the user's own cache directory, which this process writes, never from a socket.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import pathlib
import pickle
import platform
import sys
import time

from tinygrad import Device, Tensor
from tinygrad.engine.jit import CapturedJit, _TinyJit
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.nn.state import get_state_dict
from tinygrad.uop.ops import Ops, UOp

from tinyvllm.protocol import kernel_choice

log = logging.getLogger("tinyvllm.worker")
SCHEMA = 1  # bump when the stored form changes
ROOT_ENV = "TINYVLLM_CAPTURED_STEPS"
KEY_ENV = ("DEV", "BEAM", "NOOPT", "JIT", "JITBEAM", "JIT_BATCH_SIZE", "GRAPH_ONE_KERNEL", "HCQ2", "NO_MEMORY_PLANNER")
SOURCES = pathlib.Path(__file__).parent  # workers/: the model, its kernels (and workers/c/), the runner
KERNEL_CHOICE_SOURCE = pathlib.Path(kernel_choice.__file__)  # what a kernel set runs (the key names only the set)
PICKLE_RECURSION = 20_000  # a step's kernel graph is deep; the default limit of 1,000 is not enough


def cache_root() -> pathlib.Path:
    """TINYVLLM_CAPTURED_STEPS (a directory; the tests give each run its own), else ~/.cache/tinyvllm/captured-steps."""
    from tinyvllm.workers.c_kernel import cache_dir
    return pathlib.Path(root) if (root := os.environ.get(ROOT_ENV)) else cache_dir() / "captured-steps"


def _cpu_identity() -> str:
    """The CPU's model and flags (the C kernels are built for this CPU)."""
    try:
        with open("/proc/cpuinfo") as f:
            return "".join(line for line in f if line.startswith(("model name", "flags")))[:4096]
    except OSError:
        return platform.processor()


def _sources_digest() -> str:
    """The code that builds a step (a changed kernel or model must not replay the old one; the version is not bumped
    per change)."""
    digest = hashlib.sha256()
    for path in [*sorted(p for p in SOURCES.rglob("*") if p.suffix in (".py", ".c", ".h")), KERNEL_CHOICE_SOURCE]:
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def store_key(parts: dict) -> str:
    import tinygrad
    from tinyvllm import __version__
    renderer = Device[Device.DEFAULT].renderer
    described = {**parts, "schema": SCHEMA, "tinyvllm": __version__, "tinygrad": getattr(tinygrad, "__version__", "?"),
                 "sources": _sources_digest(), "python": sys.version_info[:2], "device": Device.DEFAULT,
                 "renderer": f"{type(renderer).__name__} {getattr(renderer, 'arch', '')}", "machine": platform.machine(),
                 "cpu": _cpu_identity(), "cores": os.cpu_count(), "env": {k: os.environ.get(k) for k in KEY_ENV},
                 "threads": NUM_CPU_THREADS.value}  # the CPU kernels split their work this many ways
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:32]


class _NotSavable(Exception):
    pass


class CapturedSteps:
    """The stored steps of one runner setup. `live`: every Tensor a step may read that outlives it (weights, the
    KV cache), by a name that is the same in every process of this setup."""

    def __init__(self, directory: pathlib.Path, live: dict[str, Tensor]):
        self.directory = directory
        self.pending: list[tuple[str, CapturedJit]] = []  # captured, not yet written: written while the worker idles
        self.by_name = {name: t.uop.base for name, t in live.items() if t.uop.base.op is Ops.BUFFER}
        self.names = {uop: name for name, uop in self.by_name.items()}

    @classmethod
    def for_model(cls, model, cache, key_parts: dict) -> CapturedSteps:
        """The stored steps of a ModelRunner of `model` over `cache`; key_parts: the rest of its setup."""
        live = {**get_state_dict(model, "model."), **get_state_dict(cache, "cache.")}
        return cls(cache_root() / store_key(key_parts), live)

    def jit(self, name: str, fxn) -> _TinyJit:
        """The jit of step `name` that runs fxn (ModelRunner makes its forwards' and sampler's with it): the stored
        step, else one that is stored once captured."""
        return self.load(name, fxn) or StoringJit(fxn, self, name)

    def store_next(self) -> None:
        """Writes the oldest pending step (~0.5 s: left to idle time, off the step that captured it)."""
        name, captured = self.pending.pop(0)
        try:
            self.save(name, captured)
        except Exception as e:  # a full disk, a step pickle cannot take: the next restart loses speed, nothing else
            log.warning("captured step %s not stored: %r", name, e)

    def store_all(self, within_s: float = float("inf")) -> None:
        """Writes the pending steps, those left after within_s seconds excepted."""
        deadline = time.monotonic() + within_s
        while self.pending and time.monotonic() < deadline:
            self.store_next()

    def path(self, name: str) -> pathlib.Path:
        return self.directory / f"{name}.pkl"

    def save(self, name: str, captured: CapturedJit) -> bool:
        """Writes the step (atomically); False when it reads a buffer that is neither live nor its own."""
        written = captured._written_uops
        names = self.names

        class Pickler(pickle._Pickler):  # the Python pickler: its recursion is bounded by the limit set below
            def persistent_id(self, obj):
                if not (isinstance(obj, UOp) and obj.op is Ops.BUFFER) or obj.arg.device is None:
                    return None  # a kernel's own registers are BUFFERs too, of no device: part of its code
                if obj in names:  # with its shape and type, checked against the buffer it is bound to on load
                    return ("live", names[obj], obj.src, obj.arg.dtype, obj.arg.device)
                if obj not in written:
                    raise _NotSavable(f"reads a buffer of {obj.arg} it does not write")
                return ("fresh", id(obj), obj.src, obj.arg)

        data = io.BytesIO()
        try:
            with _recursion_limit(PICKLE_RECURSION):
                # with the set of buffers it writes, which tinygrad otherwise works out on the first call (~0.5 s)
                Pickler(data, protocol=pickle.HIGHEST_PROTOCOL).dump((captured, list(written)))
        except _NotSavable as e:
            log.info("captured step %s not stored: it %s", name, e)
            return False
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.trusted():
            return False
        tmp = self.path(name).with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data.getvalue())
        os.replace(tmp, self.path(name))
        return True

    def trusted(self) -> bool:
        """Only a directory, and files, that this user owns and nobody else may write: pickle runs code on load."""
        paths = [self.directory, *self.directory.glob("*.pkl")] if self.directory.is_dir() else []
        bad = [p for p in paths if (st := stat_if_present(p)) is not None and (st.st_uid != os.getuid() or st.st_mode & 0o022)]
        if bad:
            log.warning("captured steps in %s ignored: %s is not only this user's", self.directory, bad[0])
        return not bad

    def load(self, name: str, fxn) -> _TinyJit | None:
        """The stored step as a captured TinyJit bound to this process's buffers (fxn: what it captured, should it
        have to be captured again), or None (none stored, or unreadable: then the file goes)."""
        path = self.path(name)
        if not path.is_file() or not self.trusted():
            return None
        by_name, fresh = self.by_name, {}

        class Unpickler(pickle.Unpickler):
            def persistent_load(self, pid):
                if pid[0] == "live":
                    _, name, src, dtype, device = pid
                    live = by_name[name]
                    if (live.src, live.arg.dtype, live.arg.device) != (src, dtype, device):
                        raise ValueError(f"{name} is not the buffer it was")
                    return live
                _, key, src, arg = pid
                if key not in fresh:
                    fresh[key] = UOp(Ops.BUFFER, src=src, arg=dataclasses.replace(arg, slot=next(UOp.unique_num)))
                return fresh[key]

        try:
            with open(path, "rb") as f, _recursion_limit(PICKLE_RECURSION):
                captured, written = Unpickler(f).load()
            if not isinstance(captured, CapturedJit):
                raise TypeError(type(captured).__name__)
            captured.__dict__["_written_uops"] = set(written)  # the cached_property's own slot
        except Exception as e:  # a file from a crash, or a tinygrad that reads it differently: capture anew
            log.warning("stored step %s unreadable (%s): capturing it again", name, e)
            path.unlink(missing_ok=True)
            return None
        return LoadedJit(fxn, self, name, captured)


def stat_if_present(path: pathlib.Path) -> os.stat_result | None:
    """None for a file another process (sharing the directory) removed meanwhile."""
    try:
        return path.stat()
    except FileNotFoundError:
        return None


class _recursion_limit:
    def __init__(self, limit: int):
        self.limit = limit

    def __enter__(self):
        self.saved = sys.getrecursionlimit()
        sys.setrecursionlimit(max(self.saved, self.limit))

    def __exit__(self, *exc):
        sys.setrecursionlimit(self.saved)


class StoringJit(_TinyJit):
    """A TinyJit that queues its step for the disk once captured (CapturedSteps.pending, written while idle)."""

    def __init__(self, fxn, steps: CapturedSteps, name: str):
        super().__init__(fxn)
        self.steps, self.name, self.stored = steps, name, False

    def __call__(self, *args, **kwargs):
        ret = super().__call__(*args, **kwargs)
        if not self.stored and self.captured is not None:
            self.stored = True
            self.steps.pending.append((self.name, self.captured))
        return ret


class LoadedJit(StoringJit):
    """A stored step, replayed as captured. Its first call links it (builds the device graph): `primed` says whether
    one did (ModelRunner.warm_up_bucket runs it while idle). Should that first call fail (a device or setting the
    key does not tell apart), the file goes and the step is captured anew from fxn."""

    def __init__(self, fxn, steps: CapturedSteps, name: str, captured: CapturedJit):
        super().__init__(fxn, steps, name)
        self.captured, self.cnt, self.stored, self.primed = captured, 2, True, False

    def __call__(self, *args, **kwargs):
        if self.primed:
            return super().__call__(*args, **kwargs)
        self.primed = True
        try:
            return super().__call__(*args, **kwargs)
        except Exception as e:
            log.warning("stored step %s failed (%s): capturing it again", self.name, e)
            self.steps.path(self.name).unlink(missing_ok=True)
            self.captured, self.cnt, self.stored = None, 1, False
            return super().__call__(*args, **kwargs)

