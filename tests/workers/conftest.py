"""Kernel-set fixtures (workers/kernel_set.py): the device configured for a set, and put back afterwards, so one
pytest process covers both the C kernels and tinygrad's own (what GPUs run).

`kernel_set` runs a test once per set; the test builds its model with `Transformer(..., kernels=kernel_set)`.
`module_kernel_set` does the same for a module-scoped fixture (a model built once per set for a module's tests).
`c_kernel_set` configures the "c" set for tests of its parts (the CPU graph)."""
import contextlib

import pytest
from tinygrad import Device

from tinyvllm.protocol.kernel_choice import KERNEL_SETS
from tinyvllm.workers.kernel_set import c_kernels_run_on, configure_device


@contextlib.contextmanager
def configured(kernels: str):
    """The default device set up for a kernel set, and put back afterwards."""
    dev = Device[Device.DEFAULT]
    renderers, graph = dev.renderers, dev.graph
    configure_device(Device.DEFAULT, kernels)
    try:
        yield kernels
    finally:
        dev.renderers, dev.graph = renderers, graph


def _each_set(request):
    with configured(request.param) as kernels:
        yield kernels


# the sets this device runs: both on CPU (CI), tinygrad's alone on a GPU (a parameter left out, not a skip).
# "c-int8" differs from "c" only in its products of Q4_1/Q8_0 weights: tests/workers/test_int8_matvec.py and
# tests/reference, and every test that serves with the CPU's default set.
RUNNABLE_SETS = [k for k in KERNEL_SETS if k == "tinygrad" or k == "c" and c_kernels_run_on(Device.DEFAULT)]
kernel_set = pytest.fixture(params=RUNNABLE_SETS)(_each_set)
module_kernel_set = pytest.fixture(scope="module", params=RUNNABLE_SETS)(_each_set)


@pytest.fixture
def c_kernel_set():
    with configured("c") as kernels:
        yield kernels
