"""workers/device_input.py: host arrays become realized device Tensors at once (no scheduler pass when a jit
takes them), with their values, shapes and dtypes, and work as jit inputs that change every call."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes

from tinyvllm.workers.device_input import copy_into, device_tensor, host_array


@pytest.mark.parametrize("arr", [np.arange(12, dtype=np.int32).reshape(3, 4), np.array([7, 1 << 31], np.uint32),
                                 np.linspace(-1, 1, 5, dtype=np.float32), np.array([[True, False]])])
def test_realized_with_the_arrays_values(arr):
    t = device_tensor(arr)
    assert t.uop.is_realized and t.shape == arr.shape
    assert t.dtype == {np.int32: dtypes.int32, np.uint32: dtypes.uint32, np.float32: dtypes.float32, np.bool_: dtypes.bool}[arr.dtype.type]
    np.testing.assert_array_equal(t.numpy(), arr)


def test_empty_and_scalar_arrays():
    assert device_tensor(np.zeros((0, 3), np.int32)).shape == (0, 3)
    assert device_tensor(np.float32(2.5).reshape(())).item() == 2.5


def test_jit_inputs_that_change_every_call():
    @TinyJit
    def step(a: Tensor, b: Tensor) -> Tensor:
        return (a * 2 + b).realize()

    for i in range(5):
        a, b = np.arange(6, dtype=np.int32) + i, np.full(6, i, np.int32)
        np.testing.assert_array_equal(step(device_tensor(a), device_tensor(b)).numpy(), a * 2 + b)


def test_copy_into_reuses_the_buffer_and_host_array_reads_a_jit_output():
    """The tensor-parallel forward's round trip: one input buffer refilled each call (also from a read-only array,
    as a ZMQ frame is), the jit's output read back with one copy-out; a view falls back to numpy()."""
    @TinyJit
    def step(a: Tensor) -> Tensor:
        return (a * 2).realize()

    t = device_tensor(np.zeros((2, 3), np.float32))
    buffer = t.uop.buffer
    for i in range(4):
        a = np.arange(6, dtype=np.float32).reshape(2, 3) + i
        a.flags.writeable = False
        assert copy_into(t, a) is t and t.uop.buffer is buffer
        out = host_array(step(t))
        assert out.shape == (2, 3) and out.dtype == np.float32
        np.testing.assert_array_equal(out, a * 2)
    np.testing.assert_array_equal(host_array(t[:, 1:]), (np.arange(6, dtype=np.float32).reshape(2, 3) + 3)[:, 1:])
