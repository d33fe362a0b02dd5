"""Hand-written C kernels for tinygrad's CPU backend, as tinygrad PROGRAMs.

The kernels are the .c files in workers/c/, each specialised by `#define`s: `c_source(file, defines)` is the
text tinygrad compiles. `c_kernel(name, source, cores, estimates)` is a `custom_kernel` fxn: tinygrad compiles
`source` with its own clang flags (-O2 -march=native, freestanding) and disk cache, and the JIT and
workers/cpu_graph.py run it like a generated kernel. tinygrad enters a compiled program at its first function,
so a file's entry point is its only non-inline function; it takes the custom_kernel's buffers in order (output
first), then `int core_id`: the program runs once per core id in [0, cores), each call doing its share.
`shared_library(file, flags)` builds a file with the host's clang instead: the graph executor, and the tests
that compile the kernels for other vector widths.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tinygrad import dtypes
from tinygrad.renderer import Estimates
from tinygrad.uop.ops import KernelInfo, Ops, ProgramInfo, UOp

from tinyvllm.protocol.cache_dir import cache_dir

KERNEL_DIR = Path(__file__).with_name("c")
_LOCAL_INCLUDE = re.compile(r'^#include "([^"]+)"$', re.MULTILINE)


@functools.cache
def _text(file: str) -> str:
    """workers/c/<file> with its local #includes pasted in: tinygrad compiles from stdin, with no include path."""
    return _LOCAL_INCLUDE.sub(lambda m: _text(m.group(1)), (KERNEL_DIR / file).read_text())


def c_source(file: str, defines: dict[str, int | str]) -> str:
    """The source of workers/c/<file> specialised by `#define NAME value` lines in front of it."""
    return "".join(f"#define {name} {value}\n" for name, value in defines.items()) + _text(file)


def c_kernel(name: str, source: str, cores: int, estimates: Estimates):
    def fxn(*params: UOp) -> UOp:
        core = UOp.variable("core_id", 0, cores - 1, dtypes.int, param=True)
        sink = UOp.sink(*params, core, arg=KernelInfo(name=name, estimates=estimates))
        info = ProgramInfo(name=name, global_size=(cores, 1, 1), local_size=(1, 1, 1), vars=(core,),
                           globals=tuple(range(len(params))), outs=(0,), ins=tuple(range(1, len(params))))
        return UOp(Ops.PROGRAM, src=(sink, UOp(Ops.LINEAR, src=(*sink.src, sink)), UOp(Ops.SOURCE, arg=source)), arg=info)
    return fxn


def shared_library(file: str, flags: tuple[str, ...] = ()) -> Path:
    """workers/c/<file> compiled by clang with `flags` into a shared library in ~/.cache/tinyvllm, built once
    (keyed by the source, its includes and the flags)."""
    source = _text(file)
    key = hashlib.sha256("\0".join((source, *flags)).encode()).hexdigest()[:16]
    lib_path = cache_dir() / f"{Path(file).stem}-{key}.so"
    if not lib_path.exists():
        clang = shutil.which("clang")
        if clang is None:
            raise RuntimeError(f"clang is needed to build {file} (tinygrad's CPU backend needs it too)")
        lib_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib_path.parent)
        os.close(fd)
        try:
            subprocess.run([clang, "-O2", "-shared", "-fPIC", *flags, "-o", tmp, "-x", "c", "-"], input=source.encode(),
                           check=True)
            os.replace(tmp, lib_path)  # atomic: worker processes may build it at the same time
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return lib_path
