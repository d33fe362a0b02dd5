"""Matrix products of a few rows (below workers/cpu_gemm.py's GEMM_MIN_ROWS) on the CPU backend, as hand-written
C kernels for F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q8_16, F8_E4M3, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights.

tinygrad's generated kernels for these reduced each 32-element block into a scalar, so every block ended in a
horizontal vector sum. These kernels keep one 16-lane accumulator per activation row
across the whole reduction and sum its lanes once per output: per block, the weight's 32 values are dequantised
into two vectors (q * d + m) once and multiplied into every activation row. The C (workers/c/matvec.c) uses
clang's portable vector extensions (no intrinsics), so it compiles to AVX-512, AVX2 or NEON code with
`-march=native`.

Each kernel is a tinygrad PROGRAM (workers/c_kernel.py); its output columns are split across cores through
tinygrad's `core_id` argument. Shapes, row count and core count are compile-time constants.
"""
from __future__ import annotations

from tinygrad import Tensor, dtypes
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.renderer import Estimates

from tinyvllm.workers.c_kernel import c_kernel, c_source

# the kinds the C kernels take (workers/c/weights.h)
C_KINDS = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q8_16", "F8_E4M3", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
HALF_SCALE_KINDS = ("Q4_0", "Q4_1", "Q8_0")  # whose scales (part 1 on) may be float16: SCALES_F16


def c_kernels_support(w) -> bool:
    """Whether cpu_matvec and workers/cpu_gemm.py's cpu_gemm take this DeviceWeight (whole 32-blocks per row)."""
    return w.kind in C_KINDS and w.shape[1] % 32 == 0


def c_matmul(h: Tensor, w, kernel: str, h_input: Tensor | None = None, defines: dict[str, int] | None = None,
             experts: Tensor | None = None, expert_rows: int = 0) -> Tensor:
    """h [T, K] @ w.T for a workers.quantized_weight.DeviceWeight w [N, K] (c_kernels_support): [T, N] float32,
    by workers/c/<kernel>.c (its columns split across cores, `defines` its own settings), which reads h_input
    (default: h as float32). experts [T] (int32; matvec and matvec_i8): w holds experts of expert_rows rows each,
    one after another, and row t of h is multiplied with expert experts[t]'s rows only: [T, expert_rows]."""
    assert c_kernels_support(w), w
    (rows, k), cols = h.shape, w.shape[0]
    if experts is not None:
        assert experts.dtype == dtypes.int32 and w.shape[0] % expert_rows == 0, (experts.dtype, w.shape, expert_rows)
        cols, defines = expert_rows, {**(defines or {}), "EXPERTS": 1, "N_EXPERTS": w.shape[0] // expert_rows}
    cores = max(1, min(NUM_CPU_THREADS.value, cols))
    name = f"{kernel}_{w.kind.lower()}_{rows}_{cols}_{k}_c{cores}" + ("_experts" if experts is not None else "")
    half_scales = w.kind in HALF_SCALE_KINDS and w.parts[1].dtype == dtypes.half
    source = c_source(f"{kernel}.c", {"ROWS": rows, "COLS": cols, "K": k, "CORES": cores, f"WEIGHT_{w.kind}": 1,
                                      **({"SCALES_F16": 1} if half_scales else {}), **(defines or {})})
    # an expert product reads at most its rows' experts
    weight_bytes = w.nbytes if experts is None else w.nbytes * min(rows, w.shape[0] // cols) * cols // w.shape[0]
    fxn = c_kernel(name, source, cores, Estimates(
        ops=2 * rows * cols * k, lds=weight_bytes + 4 * rows * k, mem=weight_bytes + 4 * rows * (k + cols)))
    out = Tensor.empty(rows, cols, dtype=dtypes.float32, device=h.device)
    inputs = (h.float().contiguous() if h_input is None else h_input, *(() if experts is None else (experts,)))
    return out.custom_kernel(*inputs, *w.parts, fxn=fxn)[0]


INT8_ACTIVATION_KINDS = ("Q4_0", "Q4_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0")


def takes_int8(w, int8_activations: bool) -> bool:
    """Whether a product with weight w quantises its activations to int8 (asked for, and an INT8_ACTIVATION_KINDS
    weight)."""
    return int8_activations and w.kind in INT8_ACTIVATION_KINDS


def cpu_expert_matvec(h: Tensor, w, experts: Tensor, expert_rows: int, int8_activations: bool = False) -> Tensor:
    """h [T, K], experts [T] int32 -> [T, expert_rows]: row t times expert experts[t]'s rows of w (a mixture of
    experts' FFN matrix, every expert's expert_rows rows one after another), reading only those rows."""
    return c_matmul(h, w, "matvec_i8" if takes_int8(w, int8_activations) else "matvec", experts=experts,
                    expert_rows=expert_rows)


def cpu_matvec(h: Tensor, w, int8_activations: bool = False) -> Tensor:
    """h [T, K] @ w.T (see c_matmul). Best for a few rows; workers/cpu_gemm.py's register tiles win from
    GEMM_MIN_ROWS rows (int8: INT8_GEMM_MIN_ROWS[kind]). int8_activations (INT8_ACTIVATION_KINDS weights):
    workers/c/matvec_i8.c,
    h quantised to int8 per block and multiplied with integer dot products (not exact: within half a step of each
    block's scale)."""
    return c_matmul(h, w, "matvec_i8" if takes_int8(w, int8_activations) else "matvec")
