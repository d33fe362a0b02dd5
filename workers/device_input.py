"""Host arrays as realized device Tensors, for the inputs of jitted steps, and jitted outputs back as host arrays.

`Tensor(numpy_array)` is lazy: the jit realizes it through tinygrad's scheduler, which walks every live Tensor
(the model's weights included) on each call, a few ms per step on a CPU. Copying straight into a freshly
allocated buffer skips that. Likewise `Tensor.numpy()` builds and runs a copy graph (~0.5 ms on a CPU); a
realized, contiguous output is read with one copy-out instead (the tensor-parallel forward does that 2 x layers
+ 1 times a step). Allocating even that fresh buffer costs ~0.2 ms on a CPU, so a step's inputs go into buffers
kept from the last step of their shape (HostInputs): ~15 us each.
"""
import math

import numpy as np
from tinygrad import Device, Tensor
from tinygrad.dtype import _from_np_dtype, _to_np_dtype
from tinygrad.uop.ops import Ops


def device_tensor(arr: np.ndarray, device: str | None = None) -> Tensor:
    arr = np.ascontiguousarray(arr)  # also makes a numpy scalar an array
    if arr.size == 0 or arr.ndim == 0:  # nothing to allocate / tinygrad's empty() has no 0-d shape
        return Tensor(arr, device=device or Device.DEFAULT)
    t = Tensor.empty(arr.shape, dtype=_from_np_dtype(arr.dtype), device=device or Device.DEFAULT)
    t.uop.buffer.allocate()
    return copy_into(t, arr)


def copy_into(t: Tensor, arr: np.ndarray) -> Tensor:
    """Overwrites device_tensor()'s t with arr (same shape and dtype), reusing its buffer; returns t."""
    arr = np.ascontiguousarray(arr)
    if not arr.flags.writeable:  # tinygrad's copy-in takes the address of a writable buffer (a ZMQ frame is not)
        arr = arr.copy()
    buf = t.uop.buffer
    Device[buf.device].allocator._copyin(buf._buf, memoryview(arr.reshape(-1)).cast("B"))
    return t


def host_array(t: Tensor) -> np.ndarray:
    """t's values on the host: one copy-out when t is a realized buffer seen whole (a jit's output), else numpy()."""
    base = t.uop.base
    if t.uop.op not in (Ops.BUFFER, Ops.RESHAPE) or base.op is not Ops.BUFFER or base.realized is None \
            or base.realized.size != math.prod(t.shape) or (np_dtype := _to_np_dtype(t.dtype)) is None:
        return t.numpy()
    buf = base.realized
    out = np.empty(t.shape, np_dtype)
    Device[buf.device].synchronize()
    buf.allocator._copyout(memoryview(out.reshape(-1)).cast("B"), buf._buf)
    return out


class HostInputs:
    """A jitted step's host inputs in device buffers kept per (name, shape, dtype) and overwritten each step."""
    def __init__(self):
        self.buffers: dict[tuple, Tensor] = {}

    def __call__(self, name: str, arr: np.ndarray) -> Tensor:
        arr = np.ascontiguousarray(arr)
        if (t := self.buffers.get(key := (name, arr.shape, arr.dtype.str))) is None:
            t = self.buffers[key] = device_tensor(arr)
            return t
        Device[t.device].synchronize()  # the step that read it last may still run (an asynchronous device)
        return copy_into(t, arr)
