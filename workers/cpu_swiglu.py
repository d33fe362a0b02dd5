"""An MLP's SwiGLU, silu(gate) * up, on the CPU backend as a C kernel (workers/c/swiglu.c): tinygrad's generated
kernel computes e^x by a polynomial of scalar steps, ~10x the time of this one's 16-lane exponentials, and took ~12%
of a 1B model's prompt chunk. Run as a tinygrad PROGRAM (workers/c_kernel.py), the elements split across cores."""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.renderer import Estimates

from tinyvllm.workers.c_kernel import c_kernel, c_source


def cpu_swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up for float32 [T, N] tensors."""
    rows, cols = gate.shape
    cores = max(1, min(NUM_CPU_THREADS.value, rows * cols // 4096))
    source = c_source("swiglu.c", {"ROWS": rows, "COLS": cols, "CORES": cores})
    fxn = c_kernel(f"swiglu_{rows}_{cols}_c{cores}", source, cores,
                   Estimates(ops=8 * rows * cols, lds=8 * rows * cols, mem=12 * rows * cols))
    out = Tensor.empty(rows, cols, dtype=dtypes.float32, device=gate.device)
    return out.custom_kernel(gate, up, fxn=fxn)[0]
