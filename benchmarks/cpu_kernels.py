"""The CPU backend's C matmul kernels side by side: cpu_matvec (float32 and int8 activations) vs cpu_gemm per weight
shape and row count.

    DEV=CPU python benchmarks/cpu_kernels.py --shapes 576x576 1536x1536 --rows 1 2 4 8 16

Each cell: a TinyJit chain of 32 products h = f(h, w) (so the CPU graph runs them back to back on all cores),
median over 20 calls, per product. Q4_1 weights of random blocks (the default model's type). Prints a table.
"""
import argparse
import statistics
import time

import numpy as np
from tinygrad import Device, Tensor, TinyJit

from tinyvllm.workers.cpu_gemm import cpu_gemm
from tinyvllm.workers.cpu_matvec import cpu_matvec
from tinyvllm.workers.kernel_set import configure_device
from tinyvllm.workers.quantized_weight import DeviceWeight, QuantizedArray

CHAIN = 32


def q4_1_weight(rng, n: int, k: int) -> DeviceWeight:
    blocks = rng.integers(0, 256, size=(n, k // 32, 20), dtype=np.uint8)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(1.0 / k).tobytes(), np.uint8)  # scale: keeps the chain finite
    blocks[:, :, 2:4] = np.frombuffer(np.float16(-7.5 / k).tobytes(), np.uint8)
    return DeviceWeight.from_host(QuantizedArray("Q4_1", blocks))


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
    args = ap.parse_args()
    configure_device(Device.DEFAULT, "c")  # raises unless DEV=CPU
    print("| weight | rows | cpu_matvec us | int8 matvec us | cpu_gemm us | matvec GFLOP/s | int8 GFLOP/s | gemm GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        assert n == k, "the chain feeds each product's output into the next"
        weights = [q4_1_weight(rng, n, k) for _ in range(4)]
        for rows in args.rows:
            mv, gm = time_chain(cpu_matvec, weights, rows, n), time_chain(cpu_gemm, weights, rows, n)
            i8 = time_chain(lambda h, w: cpu_matvec(h, w, int8_activations=True), weights, rows, n)
            flops = 2 * rows * n * k
            print(f"| Q4_1 {n}x{k} | {rows} | {mv * 1e6:.1f} | {i8 * 1e6:.1f} | {gm * 1e6:.1f} | {flops / mv / 1e9:.1f} | "
                  f"{flops / i8 / 1e9:.1f} | {flops / gm / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
