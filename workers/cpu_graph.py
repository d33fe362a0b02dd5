"""A TinyJit graph for tinygrad's CPU backend: a captured step's kernels run from C, on all cores.

Without it, tinygrad runs every kernel of a jitted CPU step from Python, one ctypes call each (~50 us; a
decode step has ~730 kernels), and a kernel that tinygrad split across cores (its `core_id` argument) runs
its parts one after another on the calling thread. `CPUGraph` is a tinygrad `GraphRunner`: the JIT hands it
batches of compiled kernels, it writes them once into a command table (function address, core count, the
arguments), and each replay patches only what changes (input buffer addresses, symbolic variables such as
positions) and calls `tv_run` in workers/c/graph_exec.c, which runs the table on a pool of threads.

Command table row (uint64): [function address, core count | (core_id argument index + 1) << 16, args...].
The C kernel sets ("c", "c-int8") install it (workers/kernel_set.py).
"""
from __future__ import annotations

import ctypes
import functools
import time

import numpy as np
from tinygrad.engine.jit import GraphException, GraphRunner
from tinygrad.helpers import NUM_CPU_THREADS

from tinyvllm.workers.c_kernel import shared_library

MAX_ARGS = 24  # a kernel's arguments in a command row: MAX_ARGS in workers/c/graph_exec.c


@functools.cache
def executor() -> ctypes.CDLL:
    """The executor (workers/c/graph_exec.c), built on first use, its thread pool started."""
    lib = ctypes.CDLL(str(shared_library("graph_exec.c", ("-pthread",))))
    lib.tv_start.argtypes, lib.tv_start.restype = [ctypes.c_int], ctypes.c_int
    lib.tv_run.argtypes, lib.tv_run.restype = [ctypes.c_void_p, ctypes.c_int], None
    lib.tv_max_args.restype = ctypes.c_int
    assert lib.tv_max_args() == MAX_ARGS, "MAX_ARGS differs from graph_exec.c's"
    lib.threads = lib.tv_start(NUM_CPU_THREADS.value)
    return lib


class CPUGraph(GraphRunner):
    @staticmethod
    def supports_uop(batch_devs, new_call) -> bool:
        """Compiled kernels with at most MAX_ARGS arguments and a fixed core count; the JIT runs any other call
        itself, between graphs."""
        if not GraphRunner.supports_uop(batch_devs, new_call):
            return False
        info = new_call.src[0].arg
        return len(info.globals) + len(info.vars) <= MAX_ARGS and isinstance(info.global_size[0], int)

    def __init__(self, linear, input_uops=()):
        super().__init__(linear, input_uops)
        if self.launch_dims_replace:
            raise GraphException("CPUGraph: symbolic launch dimensions")  # supports_uop keeps these out
        self.table = np.zeros((len(self.calls), 2 + MAX_ARGS), dtype=np.uint64)
        self.buffer_patches: list[tuple[int, int, int]] = []  # (row, column, input slot)
        self.var_columns: dict[tuple[int, int], int] = {}  # (row, index in the program's vars) -> column
        for j, ((_, ast, bufs, device_vars), runtime, replace) in enumerate(zip(self.calls, self.runtimes, self.uop_replace)):
            info, n_bufs = ast.arg, len(ast.arg.globals)  # supports_uop: a compiled kernel of at most MAX_ARGS arguments
            row = self.table[j]
            row[0] = runtime.addr
            core_arg = info.runtimevars.get("core_id")
            cores = int(info.global_size[0]) if core_arg is not None else 1
            row[1] = cores | ((n_bufs + core_arg + 1) << 16 if core_arg is not None else 0)
            for col, g in enumerate(info.globals):
                row[2 + col] = bufs[g].get_buf(bufs[g].device).va_addr
            position = {p: info.globals.index(p) for p in info.globals}
            self.buffer_patches += [(j, 2 + position[p], slot) for p, slot in replace if p in position]
            for i, v in enumerate(info.vars):
                if v.expr in device_vars:
                    row[2 + n_bufs + i] = device_vars[v.expr]
                self.var_columns[(j, i)] = 2 + n_bufs + i
        self.lib, self.table_ptr = executor(), self.table.ctypes.data

    def __call__(self, input_uops, var_vals, wait=False):
        for row, col, slot in self.buffer_patches:
            buf = input_uops[slot].buffer
            self.table[row, col] = buf.ensure_allocated().get_buf(buf.device).va_addr
        for j, i, val in self.updated_vars(var_vals):
            self.table[j, self.var_columns[(j, i)]] = val
        start = time.perf_counter()
        self.lib.tv_run(self.table_ptr, len(self.table))
        return time.perf_counter() - start if wait else None

