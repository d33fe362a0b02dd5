"""Which layout of workers/gpu_matvec.py's decode kernels reads a layer's weights fastest: a table of GB/s.

    DEV=CUDA python benchmarks/gpu_matvec_sweep.py --shape llama-3-8b --kinds Q8_0 F16 [--rows 1]

For each weight kind and each layout (threads per output row, output rows per thread, rows per workgroup), one
captured step runs the batch-`rows` matvecs of --layers transformer layers of the shape (q, k, v, o, gate, up,
down, each its own weights: more bytes than any L2 holds), as the model's decode step does. `GB/s`: the weights'
bytes over the median step time. The weights are uninitialised device memory: only their size matters here.
`best` lines name the fastest layout, as benchmarks/profile_step.py's --matvec-layout THREADS,ROWS,LOCAL (the
model's is KernelChoice.matvec_layout, protocol/kernel_choice.py).
"""
import argparse
import itertools
import statistics
import time

from tinygrad import Device, Tensor, TinyJit, dtypes

from tinyvllm.protocol.kernel_choice import MatvecLayout
from tinyvllm.workers.gpu_matvec import gpu_matvec, gpu_matvec_fits
from tinyvllm.workers.quantized_weight import WORDS_PER_BLOCK, DeviceWeight

SHAPES = {  # dim, kv dim, hidden dim of the models benchmarks/shape_twin.py imitates
    "llama-3-8b": (4096, 1024, 14336),
    "llama-3.2-1b": (2048, 512, 8192),
}


def device_weight(kind: str, n: int, k: int) -> DeviceWeight:
    blocks = k // 32
    scale = lambda: Tensor.empty(n, blocks, 1, dtype=dtypes.half).contiguous().realize()  # noqa: E731 (the file's)
    if kind == "Q4_1":
        return DeviceWeight(kind, (Tensor.empty(n, blocks, 16, dtype=dtypes.uint8).contiguous().realize(), scale(), scale()))
    values = Tensor.empty(n, blocks, WORDS_PER_BLOCK[kind], dtype=dtypes.uint32).contiguous().realize()
    return DeviceWeight(kind, (values,) + ((scale(),) if kind == "Q8_0" else ()))


def layer_shapes(shape: str) -> list[tuple[int, int]]:
    dim, kv, hidden = SHAPES[shape]
    return [(dim, dim), (kv, dim), (kv, dim), (dim, dim), (hidden, dim), (hidden, dim), (dim, hidden)]


def time_layout(weights: list[DeviceWeight], h: dict[int, Tensor], layout: MatvecLayout, runs: int) -> float:
    """Median seconds of one captured step of every matvec."""
    step = TinyJit(lambda: Tensor.realize(*[gpu_matvec(h[w.shape[1]], w, layout) for w in weights]))
    times = []
    for _ in range(runs + 3):  # captured on the second call
        Device[Device.DEFAULT].synchronize()
        t0 = time.perf_counter()
        step()
        Device[Device.DEFAULT].synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="llama-3-8b")
    ap.add_argument("--kinds", nargs="+", default=["Q8_0", "F16", "Q4_1"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rows", type=int, default=1, help="rows of h: the decode batch")
    ap.add_argument("--threads", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--rows-per-thread", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--local", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    shapes = layer_shapes(args.shape) * args.layers
    h = {k: Tensor.empty(args.rows, k, dtype=dtypes.float32).contiguous().realize() for _, k in shapes}
    print(f"{Device.DEFAULT} {args.shape} x{args.layers} layers, batch {args.rows}")
    print("| kind | threads | rows/thread | local | MB | ms | GB/s |\n|---|---|---|---|---|---|---|")
    for kind in args.kinds:
        weights = [device_weight(kind, n, k) for n, k in shapes]
        nbytes = sum(w.nbytes for w in weights)
        best = None
        shapes = itertools.product(args.threads, args.rows_per_thread, args.local)
        for layout in itertools.starmap(MatvecLayout, shapes):
            if not all(gpu_matvec_fits(h[w.shape[1]], w, layout) for w in weights):
                continue
            try:
                seconds = time_layout(weights, h, layout, args.runs)
            except Exception as e:  # a layout the device refuses (too many threads, too much shared memory)
                print(f"| {kind} | {layout.threads} | {layout.rows} | {layout.local} | failed: {type(e).__name__} |")
                continue
            print(f"| {kind} | {layout.threads} | {layout.rows} | {layout.local} | {nbytes / 1e6:.0f} | "
                  f"{seconds * 1e3:.3f} | {nbytes / seconds / 1e9:.0f} |", flush=True)
            best = min(best or (seconds, layout), (seconds, layout), key=lambda b: b[0])
        if best:
            print(f"best {kind}: --matvec-layout {best[1].threads},{best[1].rows},{best[1].local} "
                  f"({nbytes / best[0] / 1e9:.0f} GB/s)")
        del weights


if __name__ == "__main__":
    main()
