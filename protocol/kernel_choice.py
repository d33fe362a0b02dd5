"""The kernel sets a worker's model can run, and what each one means, named without tinygrad so every process
(the CLI, the launcher, the workers) can check and pass them.

- "c": the hand-written C kernels (workers/c/) for the matrix products and attention. Only on tinygrad's CPU
  backend with its clang renderer (workers/kernel_set.py sets the device up for them).
- "c-int8" (the CPU default): the same, with every product of a Q4_0, Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or Q8_0 weight
  taking int8 activations.
- "tinygrad": tinygrad's own kernels, what CUDA, AMD and Metal run; decode matvecs of quantised or float16
  weights take workers/gpu_matvec.py's kernels where the device has local memory, and products of more rows
  (batches, prompt chunks) workers/gpu_gemm.py's tensor-core kernels where the device has half tensor cores.

A worker's model is built with one KernelChoice (`KernelChoice.named(name)`); inside the model only that object
travels. It is plain data: workers/kernel_set.py resolves it against a device.
"""
from __future__ import annotations

from dataclasses import dataclass

KERNEL_SETS = ("c", "c-int8", "tinygrad")
C_KERNEL_SETS = ("c", "c-int8")  # the sets of the hand-written C kernels
KERNEL_KINDS = ("c", "tinygrad")  # who writes a matmul's or attention's kernels


@dataclass(frozen=True)
class MatvecLayout:
    """workers/gpu_matvec.py's layout of a decode matvec (benchmarks/gpu_matvec_sweep.py times the others)."""
    threads: int = 32  # threads sharing one output's reduction (a GROUP)
    rows: int = 4  # outputs each thread accumulates (an UPCAST)
    local: int = 4  # output rows per workgroup (a LOCAL)


@dataclass(frozen=True)
class KernelChoice:
    """What a kernel set runs. matmul and attention: one of KERNEL_KINDS. int8_activations: products of Q4_0, Q4_1, Q2_K,
    Q3_K, Q4_K, Q5_K, Q6_K and Q8_0 weights quantise their activations to int8 (C matmuls only). gpu_matvec: decode
    rows of quantised or float16 weights take workers/gpu_matvec.py's kernels, in matvec_layout (tinygrad matmuls on a device with
    local memory only: workers/kernel_set.py's kernel_choice turns it off elsewhere). tensor_cores: products of more
    rows take workers/gpu_gemm.py's kernels, half (or bfloat16) inputs summed in float32 (tinygrad matmuls on a device
    with half tensor cores only; kernel_choice turns it off elsewhere, so the CPU keeps float32);
    bfloat16_tensor_cores: BF16 weights' products too (bfloat16 inputs; where the device has no such tensor cores,
    the same kernel without them)."""
    name: str
    matmul: str
    attention: str
    int8_activations: bool = False
    gpu_matvec: bool = False
    tensor_cores: bool = False
    bfloat16_tensor_cores: bool = False
    matvec_layout: MatvecLayout = MatvecLayout()

    @classmethod
    def named(cls, name: str) -> KernelChoice:
        check_kernel_set_name(name)
        if name in C_KERNEL_SETS:
            return cls(name, matmul="c", attention="c", int8_activations=name == "c-int8")
        return cls(name, matmul="tinygrad", attention="tinygrad", gpu_matvec=True, tensor_cores=True,
                   bfloat16_tensor_cores=True)

    @property
    def c_kernels(self) -> bool:
        """Whether any of it is the hand-written C kernels (they need tinygrad's CPU backend with clang)."""
        return "c" in (self.matmul, self.attention)


def check_kernel_set_name(name: str) -> None:
    if name not in KERNEL_SETS:
        raise ValueError(f"unknown kernel set {name!r}: choose one of {', '.join(KERNEL_SETS)}")
