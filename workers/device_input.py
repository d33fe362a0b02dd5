"""Host arrays as realized device Tensors, for the inputs of jitted steps.

`Tensor(numpy_array)` is lazy: the jit realizes it through tinygrad's scheduler, which walks every live Tensor
(the model's weights included) on each call, a few ms per step on a CPU. Copying straight into a freshly
allocated buffer skips that.
"""
import numpy as np
from tinygrad import Device, Tensor
from tinygrad.dtype import _from_np_dtype


def device_tensor(arr: np.ndarray, device: str | None = None) -> Tensor:
    arr = np.ascontiguousarray(arr)
    if not arr.flags.writeable:  # tinygrad's CUDA copy-in takes the address of a writable buffer
        arr = arr.copy()
    if arr.size == 0 or arr.ndim == 0:  # nothing to allocate / tinygrad's empty() has no 0-d shape
        return Tensor(arr, device=device or Device.DEFAULT)
    t = Tensor.empty(arr.shape, dtype=_from_np_dtype(arr.dtype), device=device or Device.DEFAULT)
    buf = t.uop.buffer.allocate()
    Device[buf.device].allocator._copyin(buf._buf, memoryview(arr.reshape(-1)).cast("B"))
    return t
