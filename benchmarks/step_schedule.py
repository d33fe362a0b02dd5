"""Kernels per step and bytes they move, for a model shape on a GPU's kernels, counted on this machine: no GPU and
no weights needed, so an 8B shape costs no memory.

tinygrad's NULL device allocates nothing and runs nothing. Given a CUDA renderer whose compiler keeps the source
(nvrtc is not installed here: tests/helpers/null_cuda.py), it plans and renders the CUDA kernels an sm_90 GPU (H100) would run, with their tensor
cores, and its jit "runs" each captured step, counting kernels and the bytes tinygrad estimates each kernel moves
(GlobalCounters). The model is a shape twin (benchmarks/shape_twin.py SHAPES; every matrix of --type, or a
llama-quantize mix) whose weights are empty device tensors of each kind's layout.

    python benchmarks/step_schedule.py --shape llama-3-8b --type Q8_0 --batch 1 16 64 --prefill 2048

Each step is measured as the kernels were before workers/gpu_gemm.py and workers/paged_products.py (products of
more rows through a float32 scratch of each weight, attention over a float32 copy of every token's context; the
other kernels as they are now) and as they are. `floor GB`: what a step must read at least (every
weight once, each sequence's cached keys and values once). Estimates, not measurements: a kernel's bytes are the
buffers it touches, as tinygrad counts them (a weight read by several workgroups counts once). Requests are greedy
(sampling with temperature, top-k or top-p adds ~55 passes over the logits: workers/sampler.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import pathlib
import sys

os.environ.setdefault("DEV", "NULL:CUDA:sm_90")
os.environ.setdefault("NULL_ALLOW_COPYOUT", "1")  # sampled ids come back as zeros
os.environ.setdefault("JIT", "2")  # captured steps without device graphs: each kernel counted by itself
os.environ.setdefault("PARALLEL", "0")  # compile here: a pool process could not import this script's renderer

import numpy as np  # noqa: E402
from tinygrad import Device, GlobalCounters, Tensor  # noqa: E402
from tinygrad.dtype import _from_np_dtype  # noqa: E402
from tinygrad.engine import realize  # noqa: E402
from tinygrad.helpers import ansistrip  # noqa: E402
from tinygrad.uop.ops import Ops, sym_infer  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository: tests.helpers
from tests.helpers.null_cuda import use_source_only_cuda  # noqa: E402
from tinyvllm.protocol.messages import CachedRequestData, NewRequestData, StepPlan  # noqa: E402
from tinyvllm.protocol.model_config import ModelConfig  # noqa: E402
from tinyvllm.protocol.sampling import SamplingParams  # noqa: E402
from tinyvllm.workers import attention  # noqa: E402
from tinyvllm.workers.kernel_set import configure_device, kernel_choice  # noqa: E402
from tinyvllm.workers.kv_cache import PagedKVCache, bytes_per_block, cache_dtype  # noqa: E402
from tinyvllm.workers.model import Transformer  # noqa: E402
from tinyvllm.workers.model_runner import ModelRunner  # noqa: E402
from tinyvllm.workers.quantized_weight import DeviceWeight, QuantizedArray  # noqa: E402
from tinyvllm.workers.weights import matrix_shape  # noqa: E402

_spec = importlib.util.spec_from_file_location("shape_twin", pathlib.Path(__file__).parent / "shape_twin.py")
shape_twin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shape_twin)


def empty_weight(shape: tuple[int, ...], type_name: str, dtype: str, words: bool) -> DeviceWeight:
    """A device weight of a GGUF type in its kind's layout (DeviceWeight.host_parts of one row, N rows), unallocated."""
    if type_name == "F32" or len(shape) == 1:
        return DeviceWeight("F32", (Tensor.empty(*shape),))
    if type_name == "F16":
        row = np.zeros((1, shape[1]), np.float16)
    else:
        row = QuantizedArray.from_raw(type_name, np.zeros(shape_twin.nbytes((1, shape[1]), type_name), np.uint8), (1, shape[1]))
    kind, parts = DeviceWeight.host_parts(row, dtype, words)
    return DeviceWeight(kind, tuple(Tensor.empty(shape[0], *p.shape[1:], dtype=_from_np_dtype(p.dtype)) for p in parts))


@dataclasses.dataclass
class EmptyWeights:
    """Stands in for a workers/weight_pack.py WeightPack: the model's device weights, empty."""
    specs: list[tuple[str, tuple[int, ...], str]]

    def device_weights(self, weights: dict, layout: dict, host_parts) -> dict[str, DeviceWeight]:
        return {name: empty_weight(matrix_shape(shape), t, layout["dtype"], layout["words"]) for name, shape, t in self.specs}


def build(shape_name: str, type_name: str, now: bool, max_seqs: int, max_model_len: int, budget: int):
    s = shape_twin.SHAPES[shape_name]
    specs = shape_twin.tensor_specs(s, type_name)
    names = [name for name, _, _ in specs]
    cfg = ModelConfig.from_gguf_metadata(shape_twin.metadata(shape_name, s, {}), names)
    host = {name: None for name in names}
    if s["llama3_rope"]:
        factor, low, high, original = s["llama3_rope"]
        host["rope_freqs.weight"] = shape_twin.llama3_rope_factors(cfg.head_dim, cfg.rope_theta, factor, low, high, original)
        cfg = dataclasses.replace(cfg, rope_scaling={"rope_type": "rope_freqs"})
    attention.READ_IN_PLACE = now  # before: the gathered context
    kernels = dataclasses.replace(kernel_choice(Device.DEFAULT, "tinygrad"), tensor_cores=now)
    configure_device(Device.DEFAULT, kernels)
    model = Transformer(cfg, host, max_model_len, kernels=kernels, weight_pack=EmptyWeights(specs))
    blocks = max_seqs * -(-max_model_len // 16) + 1
    cache = PagedKVCache(cfg, blocks, 16, cache_dtype("auto", "tinygrad"))
    return cfg, ModelRunner(model, cache, max_seqs, max_model_len, budget)


KERNEL_BYTES: dict[str, list[float]] = {}  # the last counted step's kernels: name -> each launch's estimated bytes


def record_kernels() -> None:
    """Keeps each launched kernel's name and estimated bytes in KERNEL_BYTES."""
    track = realize.track_stats

    def tracking(ctx, call, st, ets):
        if call.src[0].op is Ops.PROGRAM and ctx.update_stats:
            name = ansistrip(call.src[0].arg.name)
            KERNEL_BYTES.setdefault(name, []).append(float(sym_infer(realize.estimate_uop(call).mem, ctx.var_vals)))
        return track(ctx, call, st, ets)
    realize.track_stats = tracking


def counted(runner: ModelRunner, plan: StepPlan) -> tuple[int, float]:
    GlobalCounters.reset()
    KERNEL_BYTES.clear()
    runner.execute(plan)
    return GlobalCounters.kernel_count, GlobalCounters.global_mem / 1e9


def top_kernels(n: int) -> str:
    rows = sorted(KERNEL_BYTES.items(), key=lambda kv: -sum(kv[1]))[:n]
    return "\n".join(f"    {len(b):4d} x {name:48s} {sum(b) / 1e9:8.3f} GB" for name, b in rows)


def decode_counts(runner: ModelRunner, batch: int, prompt_len: int, step0: int) -> tuple[int, float]:
    per_seq = runner.max_blocks_per_seq
    ids = [f"b{batch}-{i}" for i in range(batch)]
    runner.execute(StepPlan(step0, [NewRequestData(r, [1 + j for j in range(prompt_len)], SamplingParams(max_tokens=16, temperature=0.0),
                                                   list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)), 0, prompt_len)
                                    for i, r in enumerate(ids)], [], []))
    for s in range(3):  # captured on the second
        plan = StepPlan(step0 + 1 + s, [], [CachedRequestData(r, [], prompt_len + s, 1, [1]) for r in ids], [])
        result = counted(runner, plan)
    runner.execute(StepPlan(step0 + 9, [], [], ids))
    return result


def prefill_counts(runner: ModelRunner, prompt_len: int, step0: int) -> tuple[int, float]:
    blocks = list(range(1, 1 + runner.max_blocks_per_seq))
    for i in range(3):
        plan = StepPlan(step0 + 2 * i, [NewRequestData(f"p{i}", [1 + j % 1000 for j in range(prompt_len)],
                                                       SamplingParams(max_tokens=4, temperature=0.0), blocks, 0, prompt_len)], [], [])
        result = counted(runner, plan)
        runner.execute(StepPlan(step0 + 2 * i + 1, [], [], [f"p{i}"]))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(shape_twin.SHAPES), default="llama-3-8b")
    ap.add_argument("--type", default="Q8_0", help="every matrix's GGUF type, or a mix (Q4_K_M, Q5_K_M)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--prompt-len", type=int, default=256, help="each decoding sequence's context")
    ap.add_argument("--prefill", type=int, default=2048, help="a prompt prefilled in one step (0: none)")
    ap.add_argument("--top", type=int, default=0, help="after each row, its N kernels that move the most bytes")
    args = ap.parse_args()
    if Device.DEFAULT == "NULL":
        use_source_only_cuda()
    record_kernels()
    print(f"{args.shape} {args.type} on {Device.DEFAULT} ({type(Device[Device.DEFAULT].renderer).__name__}, "
          f"{Device[Device.DEFAULT].renderer.target})")
    print("| step | kernels of | kernels | GB moved (estimated) | floor GB |")
    print("|---|---|---|---|---|")
    max_len = max(args.prefill, args.prompt_len + 16) + 16
    for now in (False, True):
        cfg, runner = build(args.shape, args.type, now, max(args.batch), max_len, max(512, args.prefill))
        kv = bytes_per_block(cfg, 1, runner.cache.dtype)
        label = "now" if now else "before"
        for i, batch in enumerate(args.batch):
            kernels, gb = decode_counts(runner, batch, args.prompt_len, 1000 * (i + 1))
            floor = (runner.model.weight_nbytes + batch * args.prompt_len * kv) / 1e9
            print(f"| decode, batch {batch} | {label} | {kernels} | {gb:.2f} | {floor:.2f} |", flush=True)
            if args.top:
                print(top_kernels(args.top))
        if args.prefill:
            kernels, gb = prefill_counts(runner, args.prefill, 100_000)
            floor = (runner.model.weight_nbytes + args.prefill * kv) / 1e9
            print(f"| prefill, {args.prefill} tokens | {label} | {kernels} | {gb:.2f} | {floor:.2f} |", flush=True)
            if args.top:
                print(top_kernels(args.top))


if __name__ == "__main__":
    main()
