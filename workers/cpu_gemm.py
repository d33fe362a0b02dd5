"""Matrix products of GEMM_MIN_ROWS or more rows (decode batches, prefill chunks) on the CPU backend, in C.

out[T, N] = h[T, K] @ w.T, w of any kind workers/cpu_matvec.py's C_KINDS lists. Each core takes its share of
the output columns in panels of NR weight rows: the panel is dequantised once into a small float32 buffer
(L1-sized: NR x K floats), then every tile of MR activation rows runs against it with MR x NR vector accumulators
over K (each loaded value feeds NR or MR multiply-adds). So a quantised weight is read once per product and never dequantised into a
float32 copy in memory. Portable C vector extensions (workers/c/gemm.c), run as a tinygrad PROGRAM
(workers/c_kernel.py); shapes are compile-time constants.
"""
from __future__ import annotations

import platform
from pathlib import Path

from tinygrad import Tensor, dtypes
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.renderer import Estimates

from tinyvllm.workers.c_kernel import c_kernel, c_source
from tinyvllm.workers.cpu_matvec import INT8_ACTIVATION_KINDS, c_matmul, takes_int8

GEMM_MIN_ROWS = 4  # MR: with fewer rows cpu_matvec is faster (measured: docs/BENCHMARKS.md)


# with AVX-512 VNNI: the rows from which gemm_i8's tiles beat matvec_i8 on 2048-wide weights (benchmarks/cpu_kernels.py
# --shapes 2048x2048 --distinct 32, an Intel Xeon VM, matvec_i8 / gemm_i8 us at 8 and 12 rows: Q4_0 218 / 215, 336 /
# 261; Q4_1 221 / 227, 336 / 269; Q4_K 217 / 243, 333 / 297; Q5_K 233 / 274, 350 / 341; Q6_K 283 / 321, 435 / 412;
# Q8_0 at 3 rows 294 / 243; Q2_K and Q3_K, whose matvec_i8 reduces each column alone, from 6)
VNNI_INT8_GEMM_MIN_ROWS = {"Q8_0": 3, "Q4_0": 10, "Q4_1": 10, "Q2_K": 6, "Q3_K": 6, "Q4_K": 12, "Q5_K": 12, "Q6_K": 12}


def int8_gemm_min_rows(cpu_flags: str, machine: str, kind: str) -> int:
    """The same with int8 activations for a `kind` weight (either kernel gives a row the same bits; docs/BENCHMARKS.md):
    on an x86 with AVX-512 VNNI, VNNI_INT8_GEMM_MIN_ROWS (gemm_i8's tiles multiply each block of 4 weight rows in
    registers). 16 on an x86 without (AVX-VNNI alone included: both kernels then take AVX2's maddubs + madd, and the
    tiles, unpacked into memory then, were slower up to 12 rows: 4 rows 541 against 342 us, 16 rows 1,268 against
    1,700). 3 elsewhere (NEON's sdot in both kernels)."""
    if machine not in ("x86_64", "AMD64"):
        return 3
    return VNNI_INT8_GEMM_MIN_ROWS[kind] if "avx512_vnni" in cpu_flags.split() else 16


def _host_cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


INT8_GEMM_MIN_ROWS = {kind: int8_gemm_min_rows(_host_cpu_flags(), platform.machine(), kind)
                      for kind in INT8_ACTIVATION_KINDS}


def core_l2_bytes(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """One core's share of its L2 cache (Linux's sysfs: the size over the CPUs sharing it), or None where it does
    not say."""
    for index in cache_dir.glob("index*"):
        try:
            if (index / "level").read_text().strip() != "2" or (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip().upper()
            size_bytes = int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20}[size[-1]] if size[-1:] in ("K", "M") else int(size)
            shared = (index / "shared_cpu_list").read_text().strip() if (index / "shared_cpu_list").exists() else "0"
            cpus = sum(int(b) - int(a) + 1 for a, _, b in (part.partition("-") if "-" in part else (part, "-", part)
                                                           for part in shared.split(",")))
            return size_bytes // max(1, cpus)
        except (OSError, ValueError):
            continue
    return None


# gemm_i8's slab: the activation tiles each weight panel, unpacked once per slab, is multiplied with before the next
# panel. Half a core's L2, so the tiles stay there beside the panel and the weights streaming through: with 1 MB
# instead of 256 kB on a 2 MB L2, 64- and 256-row products took 1.2x less time (docs/BENCHMARKS.md).
SLAB_BYTES = (core_l2_bytes() or 512 << 10) // 2
TILE_BYTES_PER_BLOCK = 208  # workers/c/int8_rows.h's tile_t (4 rows) per 32-element block: 8 x 16 code bytes, 5 x 16


def int8_tiles(h: Tensor) -> Tensor:
    """h [T, K] quantised to int8 per 32-element block, in the tiles of 4 rows workers/c/gemm_i8.c reads (uint8)."""
    (rows, k), tiles = h.shape, (h.shape[0] + 3) // 4
    cores = max(1, min(NUM_CPU_THREADS.value, tiles))
    source = c_source("quantize_i8.c", {"ROWS": rows, "K": k, "CORES": cores})
    fxn = c_kernel(f"quantize_i8_{rows}_{k}_c{cores}", source, cores,
                   Estimates(ops=4 * rows * k, lds=4 * rows * k, mem=4 * rows * k + tiles * k // 32 * TILE_BYTES_PER_BLOCK))
    out = Tensor.empty(tiles * k // 32 * TILE_BYTES_PER_BLOCK, dtype=dtypes.uint8, device=h.device)
    return out.custom_kernel(h.float().contiguous(), fxn=fxn)[0]


def cpu_gemm(h: Tensor, w, int8_activations: bool = False, tiles: Tensor | None = None) -> Tensor:
    """h [T, K] @ w.T (see workers/cpu_matvec.py's c_matmul), for GEMM_MIN_ROWS rows or more. int8_activations
    (INT8_ACTIVATION_KINDS weights, INT8_GEMM_MIN_ROWS[kind] rows or more): h quantised as cpu_matvec's int8 path does, by
    workers/c/quantize_i8.c (or given as `tiles`, int8_tiles(h) shared by products of one input), then multiplied
    with integer dot products by workers/c/gemm_i8.c; each row's result has the bits cpu_matvec would give it."""
    if takes_int8(w, int8_activations):
        return c_matmul(h, w, "gemm_i8", int8_tiles(h) if tiles is None else tiles, {"SLAB_BYTES": SLAB_BYTES})
    return c_matmul(h, w, "gemm")
