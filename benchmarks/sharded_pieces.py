"""Decode step time of the default model in one process: the one-forward path against the tensor-parallel forward's
pieces (workers/sharded_forward.py) with a group of one rank, so the difference is what the pieces cost by
themselves (a jitted call per layer piece and the host round trips between them), without peers or waits.

    NUM_CPU_THREADS=1 DEV=CPU taskset -c 1 .venv/bin/python benchmarks/sharded_pieces.py [--steps 60]
"""
import argparse
import time

import numpy as np
from tinygrad import Device

from tinyvllm.protocol.messages import CachedRequestData, NewRequestData, StepPlan
from tinyvllm.protocol.model_path import resolve_model_path
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.workers.collective import HostGroup
from tinyvllm.workers.kernel_set import configure_device, default_kernel_set
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.model_runner import ModelRunner
from tinyvllm.workers.weights import load_weights

PROMPT_LEN = 32


def median_decode_ms(cfg, weights, kernels, sharded: bool, steps: int) -> float:
    model = Transformer(cfg, weights, 512, kernels=kernels)
    group = HostGroup("sharded-pieces-bench", 0, 1, 4 * 8 * cfg.vocab_size) if sharded else None
    runner = ModelRunner(model, PagedKVCache(cfg, 64, 16), max_num_seqs=4, max_model_len=512,
                         max_num_batched_tokens=PROMPT_LEN, group=group)
    greedy = SamplingParams(temperature=0)
    runner.execute(StepPlan(0, [NewRequestData("r", list(range(1, PROMPT_LEN + 1)), greedy, list(range(1, 9)), 0,
                                               PROMPT_LEN)], [], []))
    times = []
    for i in range(steps):
        start = time.perf_counter()
        runner.execute(StepPlan(1 + i, [], [CachedRequestData("r", [], PROMPT_LEN + i, 1, [5])], []))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times[steps // 6:]))  # the first ones capture the jits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    cfg, weights = load_weights(str(resolve_model_path(None)))
    kernels = default_kernel_set(Device.DEFAULT)
    configure_device(Device.DEFAULT, kernels)
    one = median_decode_ms(cfg, weights, kernels, False, args.steps)
    pieces = median_decode_ms(cfg, weights, kernels, True, args.steps)
    print(f"| forward ({Device.DEFAULT}, {kernels} kernels) | decode step, median (ms) |\n|---|---|")
    print(f"| one forward | {one:.1f} |\n| sharded pieces, group of one | {pieces:.1f} ({pieces / one:.2f}x) |")


if __name__ == "__main__":
    main()
