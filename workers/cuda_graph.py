"""tinygrad 0.14's CUDA graph, made to accept kernels whose grid size depends on a symbolic variable.

CUDAGraph adds each kernel to the graph with its launch dimensions evaluated at every variable = 0. A kernel
whose grid scales with a variable (attention over `nb` cache blocks, a prefill of `n` tokens) then gets a
grid of 0 blocks, which cuGraphAddKernelNode rejects ("CUDA Error 1, invalid argument"): no jitted step
of ours could run on CUDA. Replays set every symbolic grid from the call's values anyway
(GraphRunner.updated_launch_dims), so building the graph with empty grid dimensions raised to 1 is enough.
"""
from __future__ import annotations

import contextlib
import functools
import threading

from tinygrad import Device
from tinygrad.uop.ops import ProgramInfo

_patch_lock = threading.Lock()


@contextlib.contextmanager
def _grids_of_at_least_one():
    original = ProgramInfo.launch_dims

    def at_least_one(self, var_vals):
        global_size, local_size = original(self, var_vals)
        return tuple(max(1, d) for d in global_size), local_size

    with _patch_lock:
        ProgramInfo.launch_dims = at_least_one
        try:
            yield
        finally:
            ProgramInfo.launch_dims = original


@functools.cache
def _graph_class():
    from tinygrad.runtime.graph.cuda import CUDAGraph  # here: importing it loads the CUDA driver library

    class SymbolicGridCUDAGraph(CUDAGraph):
        def __init__(self, linear, input_uops=()):
            with _grids_of_at_least_one():
                super().__init__(linear, input_uops)

    return SymbolicGridCUDAGraph


def use_cuda_graph(device: str) -> bool:
    """Installs the fixed graph on `device` if it is tinygrad's CUDA backend with its CUDAGraph; returns whether
    the device now uses it."""
    if not isinstance(device, str) or device.split(":")[0] != "CUDA":
        return False
    dev = Device[device]
    if dev.graph is None:
        return False
    dev.graph = _graph_class()
    return True
