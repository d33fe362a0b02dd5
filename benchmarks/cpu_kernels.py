"""The CPU backend's C matmul kernels side by side (workers/c/: matvec and gemm with float32 activations,
matvec_i8 and gemm_i8 with int8 activations; gemm_i8's time includes quantize_i8's) per weight shape and row count.

    DEV=CPU python benchmarks/cpu_kernels.py --shapes 576x576 1536x1536 --rows 1 2 4 8 16

Each cell: a TinyJit chain of 32 products h = f(h, w) (so the CPU graph runs them back to back on all cores),
median over 20 calls, per product. --kind: Q4_1 weights of random blocks (the default model's type, the default),
Q4_0 or Q8_0 ones, Q4_K ones of the Q4_1 ones' values (every sub-block's 6-bit scale and minimum code 15), Q5_K ones (5-bit
codes, the same scale codes), Q6_K ones (every 8-bit scale 16), Q3_K ones (every 6-bit scale 16, so 16 - 32 = -16),
Q2_K ones (every 4-bit scale and minimum code 1), or F32, F16, BF16 or F8_E4M3 ones (float kernels only: matvec,
gemm) of values that keep the chain's size; GB/s is the weight's bytes per product over its time. Prints a table.
--distinct: how many different weights the chain cycles through (default 4); past the caches' size (16 of
4096x4096) it measures the rate from memory:

    DEV=CPU python benchmarks/cpu_kernels.py --kind Q4_K --shapes 4096x4096 --rows 1 --distinct 16

    DEV=CPU python benchmarks/cpu_kernels.py --kind BF16 --shapes 2048x2048 --rows 1 --kernels matvec
"""
import argparse
import statistics
import time

import numpy as np
from tinygrad import Device, Tensor, TinyJit

from tinyvllm.workers.cpu_gemm import cpu_gemm
from tinyvllm.workers.cpu_matvec import INT8_ACTIVATION_KINDS, c_matmul
from tinyvllm.workers.fp8_checkpoint import fp8_matrix
from tinyvllm.workers.kernel_set import configure_device
from tinyvllm.workers.quantized_weight import DeviceWeight, QuantizedArray

CHAIN = 32
PRODUCTS = {"matvec": lambda h, w: c_matmul(h, w, "matvec"), "matvec_i8": lambda h, w: c_matmul(h, w, "matvec_i8"),
            "gemm": cpu_gemm, "gemm_i8": lambda h, w: cpu_gemm(h, w, int8_activations=True)}  # each kernel as served
KERNELS = tuple(PRODUCTS)


def q4_1_weight(rng, n: int, k: int) -> DeviceWeight:
    blocks = rng.integers(0, 256, size=(n, k // 32, 20), dtype=np.uint8)
    scale = 1.0 / (4.6 * k ** 0.5)  # the chain's activations keep their size (4.6: the codes' spread), never denormal
    blocks[:, :, 0:2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    blocks[:, :, 2:4] = np.frombuffer(np.float16(-7.5 * scale).tobytes(), np.uint8)
    return DeviceWeight.from_host(QuantizedArray("Q4_1", blocks))


def q4_0_weight(rng, n: int, k: int) -> DeviceWeight:
    blocks = rng.integers(0, 256, size=(n, k // 32, 18), dtype=np.uint8)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(1.0 / (4.6 * k ** 0.5)).tobytes(), np.uint8)
    return DeviceWeight.from_host(QuantizedArray("Q4_0", blocks))


def q8_0_weight(rng, n: int, k: int) -> DeviceWeight:
    blocks = rng.integers(0, 256, size=(n, k // 32, 34), dtype=np.uint8)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(1.0 / (74 * k ** 0.5)).tobytes(), np.uint8)  # 74: the codes' spread
    return DeviceWeight.from_host(QuantizedArray("Q8_0", blocks))


def q4_k_weight(rng, n: int, k: int) -> DeviceWeight:
    blocks = rng.integers(0, 256, size=(n, k // 256, 144), dtype=np.uint8)
    scale = 1.0 / (4.6 * k ** 0.5)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(scale / 15).tobytes(), np.uint8)
    blocks[:, :, 2:4] = np.frombuffer(np.float16(7.5 * scale / 15).tobytes(), np.uint8)
    blocks[:, :, 4:12], blocks[:, :, 12:16] = 15, 0xFF  # 6-bit scales and minimums 15 (the high two bits in 12-15)
    return DeviceWeight.from_host(QuantizedArray("Q4_K", blocks))


def q5_k_weight(rng, n: int, k: int) -> DeviceWeight:
    blocks = rng.integers(0, 256, size=(n, k // 256, 176), dtype=np.uint8)
    scale = 1.0 / (9.2 * k ** 0.5)  # 9.2: the 5-bit codes' spread
    blocks[:, :, 0:2] = np.frombuffer(np.float16(scale / 15).tobytes(), np.uint8)
    blocks[:, :, 2:4] = np.frombuffer(np.float16(15.5 * scale / 15).tobytes(), np.uint8)
    blocks[:, :, 4:12], blocks[:, :, 12:16] = 15, 0xFF
    return DeviceWeight.from_host(QuantizedArray("Q5_K", blocks))


def q6_k_weight(rng, n: int, k: int) -> DeviceWeight:
    blocks = rng.integers(0, 256, size=(n, k // 256, 210), dtype=np.uint8)
    blocks[:, :, 192:208] = 16  # every 16 values' 8-bit scale
    blocks[:, :, 208:210] = np.frombuffer(np.float16(1.0 / (18.5 * 16 * k ** 0.5)).tobytes(), np.uint8)
    return DeviceWeight.from_host(QuantizedArray("Q6_K", blocks))


def q3_k_weight(rng, n: int, k: int) -> DeviceWeight:
    blocks = rng.integers(0, 256, size=(n, k // 256, 110), dtype=np.uint8)
    blocks[:, :, 96:104], blocks[:, :, 104:108] = 0, 0x55  # every 6-bit scale 16 (the high two bits 01 in 104-107)
    blocks[:, :, 108:110] = np.frombuffer(np.float16(1.0 / (2.3 * 16 * k ** 0.5)).tobytes(), np.uint8)
    return DeviceWeight.from_host(QuantizedArray("Q3_K", blocks))


def q2_k_weight(rng, n: int, k: int) -> DeviceWeight:
    blocks = rng.integers(0, 256, size=(n, k // 256, 84), dtype=np.uint8)
    scale = 1.0 / (1.12 * k ** 0.5)  # 1.12: the 2-bit codes' spread
    blocks[:, :, 0:16] = 0x11  # every 16 values' scale and minimum code 1
    blocks[:, :, 80:82] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    blocks[:, :, 82:84] = np.frombuffer(np.float16(1.5 * scale).tobytes(), np.uint8)
    return DeviceWeight.from_host(QuantizedArray("Q2_K", blocks))


def float_weight(rng, n: int, k: int, kind: str) -> DeviceWeight:
    if kind == "F8_E4M3":
        codes = random_e4m3_codes(rng, n, k)
        return DeviceWeight.from_host(fp8_matrix(codes, np.full((n, 1), 1.0 / (3.0 * k ** 0.5), np.float32), "w"))
    w = rng.standard_normal((n, k)).astype(np.float32) / k ** 0.5
    return DeviceWeight.from_host(w, {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[kind])


def random_e4m3_codes(rng, n: int, k: int) -> np.ndarray:
    """Random e4m3 codes of magnitude about 1-4 (exponents 7-8), random signs."""
    return (rng.integers(0x38, 0x48, (n, k)) | (rng.integers(0, 2, (n, k)) << 7)).astype(np.uint8)


def time_chain(fn, weights, rows: int, n: int) -> float:
    x = Tensor(np.random.default_rng(rows).standard_normal((rows, n)).astype(np.float32)).realize()

    @TinyJit
    def chain(h: Tensor) -> Tensor:
        for i in range(CHAIN):
            h = fn(h, weights[i % len(weights)])
        return h.realize()

    for _ in range(3):
        chain(x)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        chain(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / CHAIN


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["576x576", "1536x1536"], help="square NxN weights (a chain)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    ap.add_argument("--distinct", type=int, default=4, help="different weights in the chain (default 4)")
    ap.add_argument("--kind", default="Q4_1", choices=(*INT8_ACTIVATION_KINDS, "F32", "F16", "BF16", "F8_E4M3"))
    args = ap.parse_args()
    if not 1 <= args.distinct <= CHAIN:
        ap.error(f"--distinct takes 1 to {CHAIN} (the chain's length)")
    if args.kind not in INT8_ACTIVATION_KINDS and (int8 := [k for k in args.kernels if k.endswith("_i8")]):
        ap.error(f"--kind {args.kind} has float kernels only (matvec, gemm), not {', '.join(int8)}")
    configure_device(Device.DEFAULT, "c")  # raises unless DEV=CPU
    print("| weight | rows | " + " | ".join(f"{k} us" for k in args.kernels) + " | " +
          " | ".join(f"{k} GFLOP/s" for k in args.kernels) + " | " + " | ".join(f"{k} GB/s" for k in args.kernels)
          + " |")
    print("|---|---|" + "---|" * 3 * len(args.kernels))
    rng = np.random.default_rng(0)
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        assert n == k, "the chain feeds each product's output into the next"
        make = {"Q4_0": q4_0_weight, "Q4_1": q4_1_weight, "Q8_0": q8_0_weight, "Q2_K": q2_k_weight, "Q3_K": q3_k_weight, "Q4_K": q4_k_weight,
                "Q5_K": q5_k_weight, "Q6_K": q6_k_weight}.get(args.kind, lambda *a: float_weight(*a, args.kind))
        weights = [make(rng, n, k) for _ in range(args.distinct)]
        for rows in args.rows:
            times = [time_chain(PRODUCTS[kernel], weights, rows, n) for kernel in args.kernels]
            flops = 2 * rows * n * k
            print(f"| {args.kind} {n}x{k} | {rows} | " + " | ".join(f"{t * 1e6:.1f}" for t in times) + " | " +
                  " | ".join(f"{flops / t / 1e9:.1f}" for t in times) + " | " +
                  " | ".join(f"{weights[0].nbytes / t / 1e9:.1f}" for t in times) + " |", flush=True)


if __name__ == "__main__":
    main()
