"""workers/cuda_graph.py: graph nodes of kernels whose grid scales with a variable are built with a grid of >= 1.

The CUDA graph itself needs a GPU (benchmarks/gpu_run.sh runs the worker tests on one); what is checked here is
the launch-dimension rule it is built with, and that it stays scoped to graph construction."""
from types import SimpleNamespace

from tinygrad import UOp
from tinygrad.uop.ops import ProgramInfo

from tinyvllm.workers.cuda_graph import _grids_of_at_least_one, use_cuda_graph


def _program(global_size, local_size=(32, 1, 1)):
    return SimpleNamespace(global_size=global_size, local_size=local_size)


def test_symbolic_grid_at_zero_becomes_one_only_while_building():
    n = UOp.variable("n", 1, 64)
    prog = _program((n * 4, 3, 1))
    assert ProgramInfo.launch_dims(prog, {"n": 0})[0] == (0, 3, 1)  # what tinygrad 0.14's CUDAGraph adds
    with _grids_of_at_least_one():
        assert ProgramInfo.launch_dims(prog, {"n": 0}) == ((1, 3, 1), (32, 1, 1))
        assert ProgramInfo.launch_dims(prog, {"n": 5}) == ((20, 3, 1), (32, 1, 1))
    assert ProgramInfo.launch_dims(prog, {"n": 0})[0] == (0, 3, 1)


def test_only_cuda_devices_take_it():
    assert use_cuda_graph("CPU") is False
    assert use_cuda_graph(None) is False
