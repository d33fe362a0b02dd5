"""A step's staging memory is per layer, not per model (issue 32: a whole-model float32 scratch ran an 8B model out
of GPU memory at batch 64). Under tinygrad's kernels (what GPUs run) a step of more rows than the fused
dequantisation takes (workers/model.py FUSED_DEQUANT_MAX_ROWS) dequantises each Q8_0 matrix into a float32 scratch
before its matmul; the layers share one traced function, and the jit's memory planner reuses that scratch from layer
to layer. So what a captured step allocates beyond the weights and the KV cache does not grow with the layer count:
measured on tiny models of 2 and 8 layers, the difference stays under one layer's float32 scratch."""
import numpy as np
from tinygrad import GlobalCounters
from tinygrad.device import Buffer

from tests.helpers.tiny_model import make_tiny_gguf
from tinyvllm.protocol.messages import NewRequestData, StepPlan
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.model import FUSED_DEQUANT_MAX_ROWS, Transformer
from tinyvllm.workers.model_runner import ModelRunner
from tinyvllm.workers.weights import load_weights

DIM, FFN, ROWS = 256, 1024, 32
LAYER_SCRATCH = 3 * FFN * DIM * 4  # gate, up and down (the Q8_0 matrices) as float32


def step_allocation(path, monkeypatch, kernels: str) -> int:
    """The most bytes allocated at once, beyond the model and its cache, while a ROWS-token prefill step runs
    three times (eagerly, captured, replayed)."""
    cfg, weights = load_weights(path)
    runner = ModelRunner(Transformer(cfg, weights, 256, kernels=kernels), PagedKVCache(cfg, 16, 16),
                         max_num_seqs=1, max_model_len=256, max_num_batched_tokens=ROWS)
    base = peak = GlobalCounters.mem_used
    allocate = Buffer.allocate

    def counting(buffer, *args, **kwargs):
        nonlocal peak
        result = allocate(buffer, *args, **kwargs)
        peak = max(peak, GlobalCounters.mem_used)
        return result

    monkeypatch.setattr(Buffer, "allocate", counting)
    prompt = np.random.default_rng(0).integers(100, 40000, ROWS).tolist()
    for step in range(3):
        request = NewRequestData(f"r{step}", prompt, SamplingParams(temperature=0, max_tokens=1), [0, 1], 0, ROWS)
        runner.execute(StepPlan(step + 1, [request], [], []))
    monkeypatch.setattr(Buffer, "allocate", allocate)
    return peak - base


def test_a_steps_scratch_does_not_grow_with_the_layers(tmp_path, monkeypatch, kernel_set):
    """Under the C kernels too, which dequantise block by block into registers and an L1 panel: no scratch."""
    assert ROWS > FUSED_DEQUANT_MAX_ROWS  # tinygrad's scratch path
    shallow, deep = (step_allocation(make_tiny_gguf(tmp_path / f"{n}.gguf", n_layers=n, dim=DIM, ffn=FFN), monkeypatch,
                                     kernel_set) for n in (2, 8))
    print(f"step allocations: 2 layers {shallow / 1e6:.1f} MB, 8 layers {deep / 1e6:.1f} MB, "
          f"one layer's scratch {LAYER_SCRATCH / 1e6:.1f} MB")
    if kernel_set == "tinygrad":
        assert shallow > LAYER_SCRATCH  # the scratch is there (at least one layer's)
    assert deep - shallow < LAYER_SCRATCH  # and reused: 6 more layers add less than one layer's worth
