"""One layer's decode attention (write the step's keys/values, then attend) per KV cache dtype and kernel set.

    DEV=CPU python benchmarks/kv_attention.py --batch 16 --context 1024 [--kernels c tinygrad]

--chunk N: each sequence attends a prompt chunk of its last N positions instead (causal: N queries a sequence):

    DEV=CPU python benchmarks/kv_attention.py --batch 1 --context 2048 --chunk 512 --dtypes float32 float16

The default model's attention shape (9 query heads, 3 kv heads, head_dim 64, blocks of 16); every sequence has
`context` tokens in the cache (random values, each dtype's own rounding). A TinyJit of workers/attention.py's
PagedAttention, median of 25 calls after 5 warm-ups. Prints a table: ms per call and the cache bytes it read per
second (the keys and values of every sequence, scales included).
"""
import argparse
import statistics
import time

import numpy as np
from tinygrad import Device, Tensor, TinyJit

from tinyvllm.protocol.kernel_choice import KERNEL_SETS, KernelChoice
from tinyvllm.protocol.kv_cache_dtype import KV_CACHE_DTYPES
from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.workers.attention import PagedAttention
from tinyvllm.workers.kernel_set import configure_device, default_kernel_set
from tinyvllm.workers.kv_cache import PagedKVCache, bytes_per_slot, cache_dtype
from tinyvllm.workers.kv_write import write_layer

CFG = ModelConfig(arch="llama", vocab_size=49152, dim=576, n_layers=1, n_heads=9, n_kv_heads=3, head_dim=64,
                  ffn_dim=1536, rope_theta=10000.0, rms_eps=1e-5, max_context=8192, tie_embeddings=True)
BLOCK_SIZE = 16


def time_attention(dtype: str, kernels: str, batch: int, context: int, chunk: int = 1) -> float:
    configure_device(Device.DEFAULT, kernels)
    per_seq = -(-(context + 1) // BLOCK_SIZE)
    cache = PagedKVCache(CFG, batch * per_seq, BLOCK_SIZE, cache_dtype(dtype, kernels))
    rng = np.random.default_rng(0)
    slots = np.arange(batch * per_seq * BLOCK_SIZE, dtype=np.int32)
    kv = rng.standard_normal((len(slots), 2, CFG.n_kv_heads, CFG.head_dim)).astype(np.float32)
    Tensor.realize(*[t for t in write_layer(cache, 0, Tensor(kv), Tensor(slots)) if t is not None])
    tables = Tensor(np.arange(batch * per_seq, dtype=np.int32).reshape(batch, per_seq))
    tokens = batch * chunk  # sequence b's chunk: positions context - chunk + 1 .. context
    rows = Tensor(np.repeat(np.arange(batch, dtype=np.int32), chunk))
    positions = Tensor(np.tile(np.arange(context - chunk + 1, context + 1, dtype=np.int32), batch))
    n_valid = Tensor(np.array([tokens], np.int32))
    q = Tensor(rng.standard_normal((tokens, CFG.n_heads, CFG.head_dim)).astype(np.float32)).realize()
    new_kv = Tensor(rng.standard_normal((tokens, 2, CFG.n_kv_heads, CFG.head_dim)).astype(np.float32)).realize()
    choice = KernelChoice.named(kernels)
    step = TinyJit(lambda q, kv: PagedAttention(cache, tables, rows, positions, n_valid, per_seq, choice)(
        0, q, kv).realize())
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        step(q, new_kv)
        Device[Device.DEFAULT].synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[5:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=1, help="queries a sequence: 1 a decode, more a prompt chunk")
    ap.add_argument("--dtypes", nargs="+", default=[d for d in KV_CACHE_DTYPES if d != "auto"])
    ap.add_argument("--kernels", nargs="+", choices=KERNEL_SETS, default=[default_kernel_set(Device.DEFAULT)])
    args = ap.parse_args()
    print(f"| kernels | KV dtype | ms | cache GB/s |  (batch {args.batch}, context {args.context}, chunk {args.chunk})"
          "\n|---|---|---|---|")
    for kernels in args.kernels:
        for dtype in args.dtypes:
            s = time_attention(dtype, kernels, args.batch, args.context, args.chunk)
            read = args.batch * (args.context + 1) * bytes_per_slot(CFG, cache_dtype(dtype, kernels))
            print(f"| {kernels} | {dtype} | {s * 1e3:.2f} | {read / s / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
