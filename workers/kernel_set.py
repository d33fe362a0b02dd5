"""Which kernels a worker's model runs, chosen explicitly and set up by one start-up call.

- "c": the hand-written C kernels (workers/c/) for the matrix products and attention, tinygrad's own kernels
  rendered with permission to reassociate (workers/cpu_matmul.py's ReassociatingClangRenderer), and the C
  graph executor for jitted steps (workers/cpu_graph.py). Only on tinygrad's CPU backend with its clang renderer.
- "c-int8" (the CPU default): the same, with every product of a Q4_1 or Q8_0 weight taking int8 activations and
  integer dot products (workers/c/matvec_i8.c for 1-2 rows, quantize_i8.c + gemm_i8.c from 3; within each
  activation block's quantisation step of "c"; a row's result does not depend on the rows beside it).
- "tinygrad": tinygrad's own kernels and graph, what CUDA, AMD and Metal run; on CPU too, so CI runs that path.

`Transformer(..., kernels=...)` picks the kernels a model traces; `configure_device(device, kernels)` sets the
device up for them (the worker calls it once at start-up). Nothing here acts at import or in a constructor.
"""
from __future__ import annotations

from tinygrad import Device
from tinygrad.renderer.cstyle import ClangRenderer

from tinyvllm.workers.cpu_graph import CPUGraph
from tinyvllm.workers.cpu_matmul import ReassociatingClangRenderer
from tinyvllm.workers.cuda_graph import use_cuda_graph

KERNEL_SETS = ("c", "c-int8", "tinygrad")
C_KERNEL_SETS = ("c", "c-int8")  # the sets of the hand-written C kernels


def _backend(device: str) -> str:
    return device.split(":")[0]


def c_kernels_run_on(device: str) -> bool:
    """Whether the C kernel sets can run on `device`: tinygrad's CPU backend rendering with clang (not DEV=CPU:LLVM)."""
    return _backend(device) == "CPU" and isinstance(Device[device].renderer, ClangRenderer)


def default_kernel_set(device: str) -> str:
    """"c-int8" where the C kernels run: it decodes a single stream ~12% faster than "c", batches and prefills
    about as fast, and keeps Hugging Face's greedy tokens up to near-ties (docs/BENCHMARKS.md)."""
    return "c-int8" if c_kernels_run_on(device) else "tinygrad"


def check_kernel_set(device: str, kernels: str) -> None:
    if kernels not in KERNEL_SETS:
        raise ValueError(f"unknown kernel set {kernels!r}: choose one of {', '.join(KERNEL_SETS)}")
    if kernels in C_KERNEL_SETS and not c_kernels_run_on(device):
        raise ValueError(f"the {kernels} kernel set needs tinygrad's CPU backend with its clang renderer (DEV=CPU), not "
                         f"{device}: use --cpu-kernels tinygrad")


def configure_device(device: str, kernels: str) -> None:
    """Sets `device` up for the kernel set: on CPU, the C sets ("c", "c-int8") install the reassociating renderer and the C graph
    executor and "tinygrad" takes them out again (tinygrad's defaults); on CUDA, the graph that accepts
    symbolic grids (workers/cuda_graph.py)."""
    check_kernel_set(device, kernels)
    dev = Device[device]
    if _backend(device) == "CPU":
        stock = [r for r in dev.renderers if r is not ReassociatingClangRenderer]
        dev.renderers = [ReassociatingClangRenderer, *stock] if kernels in C_KERNEL_SETS else stock
        if kernels in C_KERNEL_SETS:
            dev.graph = CPUGraph
        elif dev.graph is CPUGraph:
            dev.graph = None
    use_cuda_graph(device)
