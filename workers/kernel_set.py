"""Which kernels a worker's model runs, chosen explicitly and set up by one start-up call.

The sets and what each one runs are protocol/kernel_choice.py's (KERNEL_SETS, KernelChoice). Here, the device side:
- "c" and "c-int8" also render tinygrad's own kernels with permission to reassociate (workers/cpu_matmul.py's
  ReassociatingClangRenderer) and run jitted steps on the C graph executor (workers/cpu_graph.py). "c-int8"'s
  int8 products (workers/c/matvec_i8.c for a few rows, quantize_i8.c + gemm_i8.c from a row count per weight kind:
  workers/cpu_gemm.py) stay within each activation block's quantisation step of "c", and a row's result does not
  depend on the rows beside it.
- "tinygrad": tinygrad's own kernels and graph; on CPU too, so CI runs that path.

`Transformer(..., kernels=...)` picks the kernels a model traces (`kernel_choice` resolves them for the device);
`configure_device(device, kernels)` sets the device up for them (the worker calls it once at start-up). Nothing
here acts at import or in a constructor.
"""
from __future__ import annotations

import dataclasses

from tinygrad import Device, dtypes
from tinygrad.renderer.cstyle import ClangRenderer

from tinyvllm.protocol.kernel_choice import KernelChoice
from tinyvllm.workers.cpu_graph import CPUGraph
from tinyvllm.workers.cpu_matmul import ReassociatingClangRenderer
from tinyvllm.workers.cuda_graph import use_cuda_graph
from tinyvllm.workers.gpu_gemm import has_tensor_cores
from tinyvllm.workers.gpu_matvec import gpu_matvec_device


def _backend(device: str) -> str:
    return device.split(":")[0]


def c_kernels_run_on(device: str) -> bool:
    """Whether the C kernel sets can run on `device`: tinygrad's CPU backend rendering with clang (not DEV=CPU:LLVM)."""
    return _backend(device) == "CPU" and isinstance(Device[device].renderer, ClangRenderer)


def default_kernel_set(device: str) -> str:
    """"c-int8" where the C kernels run: it decodes a single stream ~12% faster than "c", batches and prefills
    about as fast, and keeps Hugging Face's greedy tokens up to near-ties (docs/BENCHMARKS.md)."""
    return "c-int8" if c_kernels_run_on(device) else "tinygrad"


def _as_choice(kernels: str | KernelChoice) -> KernelChoice:
    return kernels if isinstance(kernels, KernelChoice) else KernelChoice.named(kernels)


def check_kernel_set(device: str, kernels: str | KernelChoice) -> None:
    kernels = _as_choice(kernels)
    if kernels.c_kernels and not c_kernels_run_on(device):
        raise ValueError(f"the {kernels.name} kernel set needs tinygrad's CPU backend with its clang renderer "
                         f"(DEV=CPU), not {device}: use --kernels tinygrad")


def kernel_choice(device: str, kernels: str | KernelChoice | None = None) -> KernelChoice:
    """The kernels a model on `device` runs: a set's name (None: the device's default) or a KernelChoice, checked,
    with the GPU matvecs left out where the device has no local memory and the tensor-core products where it has no
    half tensor cores."""
    choice = _as_choice(kernels or default_kernel_set(device))
    check_kernel_set(device, choice)
    return dataclasses.replace(choice, gpu_matvec=choice.gpu_matvec and gpu_matvec_device(device),
                               tensor_cores=choice.tensor_cores and has_tensor_cores(device),
                               bfloat16_tensor_cores=choice.bfloat16_tensor_cores
                               and has_tensor_cores(device, dtypes.bfloat16))


def configure_device(device: str, kernels: str | KernelChoice) -> None:
    """Sets `device` up for the kernel set: on CPU, the C sets ("c", "c-int8") install the reassociating renderer
    and the C graph executor and "tinygrad" takes them out again (tinygrad's defaults); on CUDA, the graph that
    accepts symbolic grids (workers/cuda_graph.py)."""
    check_kernel_set(device, kernels)
    c_kernels = _as_choice(kernels).c_kernels
    dev = Device[device]
    if _backend(device) == "CPU":
        stock = [r for r in dev.renderers if r is not ReassociatingClangRenderer]
        dev.renderers = [ReassociatingClangRenderer, *stock] if c_kernels else stock
        if c_kernels:
            dev.graph = CPUGraph
        elif dev.graph is CPUGraph:
            dev.graph = None
    use_cuda_graph(device)
