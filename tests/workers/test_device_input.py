"""workers/device_input.py: host arrays become realized device Tensors at once (no scheduler pass when a jit
takes them), with their values, shapes and dtypes, and work as jit inputs that change every call."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes

from tinyvllm.workers.device_input import device_tensor


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
