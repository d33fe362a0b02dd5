"""Where a worker step's time goes: model forward vs sampling, per decode batch size, on the real model.

    DEV=CPU python benchmarks/profile_step.py --batch 1 16 --steps 20 [--prefill-len 256]
    DEV=CUDA python benchmarks/profile_step.py --batch 1 16 64 256 --copy-bandwidth

Drives workers.model_runner.ModelRunner directly with StepPlans (no scheduler, no IPC), so the numbers are
the worker's own cost per step: forward and sampling timed apart, then `execute ms`, the same number of
further steps through ModelRunner.execute (what the worker runs per StepPlan). Prints a table of medians;
`kernels`: how many kernels the captured decode step runs. `host ms` (the CPU's C kernel sets, whose graph
executor runs a step's kernels synchronously): execute ms minus the time inside those graphs, i.e. the worker's
own Python, input copies and tinygrad's call overhead per step.
--prefill-len N also times whole-prompt prefills of N tokens (one sequence, after two compiling runs).
`GB/s` is the fewest bytes a decode step must read (every weight once, each sequence's keys and values once)
over the step time; --copy-bandwidth first measures the device's own copy rate (bytes read + written), the
ceiling to hold it against.
--kv-cache-dtype picks the cache's dtype (protocol/kv_cache_dtype.py; default float32).
--kernels (or --cpu-kernels) picks the kernel set (protocol/kernel_choice.py; default: the device's); with
tinygrad's kernels, --no-gpu-matvec leaves out workers/gpu_matvec.py's decode matvecs (the old decode path) and
--matvec-layout THREADS,ROWS,LOCAL sets their layout (benchmarks/gpu_matvec_sweep.py's `best` lines);
--dtype float32 turns every weight into float32 at load (the engine's --dtype). Add DEBUG=2 to see tinygrad's per-kernel
times (with JIT=2, tinygrad's jit without graphs, else a step's kernels run inside the graph and are not timed one by
one).
"""
import argparse
import dataclasses
import statistics
import time

from tinygrad.uop.ops import Ops

from tinyvllm.protocol.engine_config import WEIGHT_DTYPES
from tinyvllm.protocol.kernel_choice import KERNEL_SETS, KernelChoice, MatvecLayout
from tinyvllm.protocol.kv_cache_dtype import KV_CACHE_DTYPES
from tinyvllm.protocol.messages import CachedRequestData, NewRequestData, StepPlan
from tinyvllm.protocol.sampling import SamplingParams


def build(model: str | None, max_num_seqs: int, block_size: int, max_model_len: int, kernels: str | KernelChoice | None,
          dtype: str, kv_cache_dtype: str = "float32", max_fused_rows: int | None = None):
    from tinygrad import Device
    from tinyvllm.workers.kernel_set import configure_device, default_kernel_set
    from tinyvllm.workers.kv_cache import PagedKVCache, cache_dtype
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.weights import load_weights
    from tinyvllm.workers.model_runner import ModelRunner
    cfg, weights = load_weights(model)
    blocks = max_num_seqs * (-(-max_model_len // block_size)) + 1
    kernels = kernels or default_kernel_set(Device.DEFAULT)
    configure_device(Device.DEFAULT, kernels)
    fused = {} if max_fused_rows is None else {"max_fused_rows": max_fused_rows}
    model = Transformer(cfg, weights, max_model_len, kernels=kernels, dtype=dtype, **fused)
    kv_dtype = cache_dtype(kv_cache_dtype, kernels if isinstance(kernels, str) else kernels.name)
    runner = ModelRunner(model, PagedKVCache(cfg, blocks, block_size, kv_dtype),
                         max_num_seqs, max_model_len, max(512, max_model_len - 64))
    return cfg, runner


def copy_bandwidth(gib: float = 1.0, runs: int = 10) -> float:
    """GB/s of a device-to-device elementwise copy (bytes read + bytes written), median of `runs`."""
    from tinygrad import Device, Tensor
    n = int(gib * (1 << 30)) // 4
    a = Tensor.ones(n).contiguous().realize()
    times = []
    for _ in range(runs + 2):  # the first two compile and warm up
        Device[Device.DEFAULT].synchronize()
        t0 = time.perf_counter()
        (a + 1).realize()
        Device[Device.DEFAULT].synchronize()
        times.append(time.perf_counter() - t0)
    return 2 * n * 4 / statistics.median(times[2:]) / 1e9


def decode_bytes(runner, batch: int, context: float) -> float:
    """The fewest bytes one decode step reads: every weight once and each sequence's cached keys and values."""
    from tinyvllm.workers.kv_cache import bytes_per_block
    cfg = runner.model.cfg
    return runner.model.weight_nbytes + batch * context * bytes_per_block(cfg, 1, runner.cache.dtype)


def profile_batch(runner, batch: int, prompt_len: int, steps: int, step0: int) -> dict:
    bs, per_seq = runner.cache.block_size, runner.max_blocks_per_seq
    ids = [f"b{batch}-{i}" for i in range(batch)]
    new = [NewRequestData(r, [1 + (i * 7 + j) % 1000 for j in range(prompt_len)], SamplingParams(max_tokens=2 * steps + 8, temperature=0.0),
                          list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)), 0, prompt_len) for i, r in enumerate(ids)]
    first = runner.execute(StepPlan(step0, new, [], []))
    last = dict(zip(first.req_ids, first.sampled_token_ids))  # each request's newest token, which the next plan brings
    forward, sample, total = [], [], []
    t_capture = time.perf_counter()
    for s in range(steps + 3):  # the first steps compile and warm up
        plan = StepPlan(step0 + 1 + s, [], [CachedRequestData(r, [], prompt_len + s, 1, [last[r]]) for r in ids], [])
        t0 = time.perf_counter()
        work = runner.compute(plan)
        work.logits.realize()
        t1 = time.perf_counter()
        tokens, _ = runner.sampler.sample([c.state for c in work.rows], work.logits)
        last.update((chunk.req_id, token) for chunk, token in zip(work.rows, tokens))
        t2 = time.perf_counter()
        if s == 2:
            t_capture = time.perf_counter() - t_capture
        if s >= 3:
            forward.append(t1 - t0), sample.append(t2 - t1), total.append(t2 - t0)
    executed, host = [], []  # the same steps the way the worker runs a StepPlan: ModelRunner.execute
    for s in range(steps + 3, 2 * steps + 3):
        in_graphs = GRAPH_SECONDS[0]
        t0 = time.perf_counter()
        result = runner.execute(StepPlan(step0 + 1 + s, [], [CachedRequestData(r, [], prompt_len + s, 1, [last[r]])
                                                             for r in ids], []))
        last.update(zip(result.req_ids, result.sampled_token_ids))
        executed.append(time.perf_counter() - t0)
        host.append(executed[-1] - (GRAPH_SECONDS[0] - in_graphs))
    runner.execute(StepPlan(step0 + 2 * steps + 10, [], [], ids))
    med = statistics.median
    return {"batch": batch, "forward_ms": med(forward) * 1e3, "sample_ms": med(sample) * 1e3,
            "step_ms": med(total) * 1e3, "tok_s": batch / med(total), "execute_ms": med(executed) * 1e3, "capture_s": t_capture,
            "host_ms": med(host) * 1e3 if GRAPH_SECONDS[0] else None,
            "gb_s": decode_bytes(runner, batch, prompt_len + 1.5 * steps + 3) / med(executed) / 1e9,
            "kernels": kernels_per_step(runner, batch)}


GRAPH_SECONDS = [0.0]  # time spent inside the C graph executor's calls (time_graphs)


def time_graphs() -> None:
    """Counts the seconds of every workers/cpu_graph.py graph call into GRAPH_SECONDS."""
    from tinyvllm.workers.cpu_graph import CPUGraph
    call = CPUGraph.__call__

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return call(self, *args, **kwargs)
        finally:
            GRAPH_SECONDS[0] += time.perf_counter() - t0
    CPUGraph.__call__ = timed


def kernels_per_step(runner, batch: int) -> int:
    """Kernels in the captured forward of a `batch`-token step (those batched into a device graph counted one by one)."""
    jit = runner.forward_jits[min(t for t in runner.token_buckets if t >= batch)]
    calls = jit.captured.linear.src if jit.captured is not None else ()
    return sum(1 if c.src[0].op is Ops.PROGRAM else len(c.src[0].src[0].src) if c.src[0].op is Ops.CUSTOM_FUNCTION
               and c.src[0].arg == "graph" else 0 for c in calls)


def profile_prefill(runner, prompt_len: int, runs: int, step0: int) -> float:
    """Median ms of ModelRunner.execute for a plan that prefills a whole prompt of prompt_len tokens."""
    blocks = list(range(1, 1 + runner.max_blocks_per_seq))
    times = []
    for i in range(runs + 2):  # the first two compile
        req = f"p{i}"
        plan = StepPlan(step0 + 2 * i, [NewRequestData(req, [1 + (i * 7 + j) % 1000 for j in range(prompt_len)],
                                                      SamplingParams(max_tokens=4, temperature=0.0), blocks, 0, prompt_len)], [], [])
        t0 = time.perf_counter()
        runner.execute(plan)
        times.append(time.perf_counter() - t0)
        runner.execute(StepPlan(step0 + 2 * i + 1, [], [], [req]))
    return statistics.median(times[2:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--prefill-len", type=int, default=0)
    ap.add_argument("--copy-bandwidth", action="store_true", help="measure the device's copy rate first")
    ap.add_argument("--kernels", "--cpu-kernels", choices=KERNEL_SETS, default=None, help="the kernel set")
    ap.add_argument("--no-gpu-matvec", action="store_true", help="tinygrad's kernels without workers/gpu_matvec.py's")
    ap.add_argument("--matvec-layout", type=lambda s: MatvecLayout(*map(int, s.split(","))), default=None,
                    metavar="THREADS,ROWS,LOCAL", help="workers/gpu_matvec.py's layout (default: MatvecLayout())")
    ap.add_argument("--dtype", default="auto", choices=WEIGHT_DTYPES, help="the weights' width on the device")
    ap.add_argument("--fused-rows", type=int, default=None,
                    help="with tinygrad's kernels: dequantise inside the matmul up to this many rows (else a scratch copy)")
    ap.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="float32",
                    help="the KV cache's dtype (also prints how many sequences of the prompt and steps fit in 1 GiB)")
    args = ap.parse_args()
    if args.copy_bandwidth:
        print(f"device copy (read + write): {copy_bandwidth():.0f} GB/s", flush=True)
    t0 = time.perf_counter()
    kernels = args.kernels
    if args.no_gpu_matvec or args.matvec_layout:
        from tinygrad import Device
        from tinyvllm.workers.kernel_set import default_kernel_set
        kernels = KernelChoice.named(kernels or default_kernel_set(Device.DEFAULT))
        kernels = dataclasses.replace(kernels, gpu_matvec=kernels.gpu_matvec and not args.no_gpu_matvec,
                                      matvec_layout=args.matvec_layout or kernels.matvec_layout)
    cfg, runner = build(args.model, max(args.batch), 16, max(512, args.prefill_len + 64), kernels,
                        args.dtype, args.kv_cache_dtype, args.fused_rows)
    print(f"loaded in {time.perf_counter() - t0:.1f}s")
    from tinyvllm.workers.kv_cache import bytes_per_slot
    context = args.prompt_len + 2 * args.steps + 3
    fit = (1 << 30) // (bytes_per_slot(cfg, runner.cache.dtype) * context)
    print(f"KV cache {runner.cache.dtype}: {bytes_per_slot(cfg, runner.cache.dtype)} bytes per token; "
          f"sequences of {context} tokens in 1 GiB: {fit}")
    print(f"weights on the device: {runner.model.weight_nbytes / 1e6:.1f} MB")
    time_graphs()
    print("| batch | forward ms | sampling ms | step ms | tokens/s | execute ms | host ms | GB/s | kernels | capture s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, b in enumerate(args.batch):
        r = profile_batch(runner, b, args.prompt_len, args.steps, i * 1000)
        host = "-" if r["host_ms"] is None else f"{r['host_ms']:.2f}"
        print(f"| {r['batch']} | {r['forward_ms']:.1f} | {r['sample_ms']:.1f} | {r['step_ms']:.1f} | {r['tok_s']:.2f} | "
              f"{r['execute_ms']:.1f} | {host} | {r['gb_s']:.1f} | {r['kernels']} | {r['capture_s']:.1f} |", flush=True)
    if args.prefill_len:
        ms = profile_prefill(runner, args.prefill_len, 3, 100_000)
        print(f"\n| prefill tokens | execute ms | tokens/s |\n|---|---|---|\n| {args.prefill_len} | {ms:.1f} | {args.prefill_len / ms * 1e3:.0f} |")


if __name__ == "__main__":
    main()
