"""workers/gpu_gemm.py: products of many rows with the weight dequantised inside the kernel, half (BF16: bfloat16)
inputs summed in float32, equal to the float64 product of the same half-rounded inputs, for every kind it reads and
both value layouts (the GPU's uint32 words and plain arrays). On the CPU the kernel runs under tinygrad's own opts;
on tinygrad's PYTHON device emulating an sm_80 GPU (DEV=PYTHON::sm_80, in a subprocess: the target is read at
start-up) it runs on emulated tensor cores, and each product's program is checked to hold WMMA instructions,
through `linear` as a model calls it (a kind the kernel does not read goes through the half scratch, on tensor cores
too). On a GPU benchmarks/gpu_run.sh check runs this file on the real device."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tinygrad import Device, Tensor, dtypes

from tests.helpers.gguf_writer import quantize, random_blocks
from tests.workers.conftest import configured
from tinyvllm.workers.gpu_gemm import gpu_gemm, gpu_gemm_fits, half_scratch_product, has_tensor_cores
from tinyvllm.workers.gpu_matvec import gpu_matvec
from tinyvllm.workers.product_ends import RowInput
from tinyvllm.workers.quantized_weight import DeviceWeight, QuantizedArray

# the repository first, then what the caller has (a GPU machine's wheels: benchmarks/gpu_run.sh)
REPO_PATH = os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])
N, K = 32, 512  # 16 blocks: the tensor cores' K
ROWS = (16, 24)  # a whole tensor-core tile, and one padded to it


def host_weight(kind: str, rng: np.random.Generator, K: int = K, N: int = N):
    if kind in ("Q4_K", "Q5_K", "Q6_K"):  # random valid super-blocks (the writer does not quantise K-quants)
        return QuantizedArray(kind, random_blocks(kind, (N, K // 256), rng, 1e-2))
    x = rng.standard_normal((N, K)).astype(np.float32)
    if kind == "F16":
        return x.astype(np.float16)
    if kind == "BF16":
        bits = (x.view(np.uint32) >> 16).astype("<u2")  # truncated: any bfloat16 matrix will do
        return QuantizedArray("BF16", bits.view(np.uint8).reshape(N, K, 2))
    return QuantizedArray.from_raw(kind, np.frombuffer(quantize(x, kind), np.uint8), x.shape)


def rounded(x: np.ndarray, kind: str) -> np.ndarray:
    """x as the kernel's inputs hold it: half, or bfloat16 (rounded to nearest even) for BF16."""
    if kind != "BF16":
        return x.astype(np.float16).astype(np.float64)
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32).astype(np.float64)


def check_product(kind: str, words: bool, rows: int, product, K: int = K, N: int = N) -> None:
    rng = np.random.default_rng(rows)
    host = host_weight(kind, rng, K, N)
    w = DeviceWeight.from_host(host, words=words)
    assert (w.parts[0].dtype == dtypes.uint32) == (words and kind in ("F16", "Q8_0"))
    h = rng.standard_normal((rows, K)).astype(np.float32)
    expected = rounded(h, kind) @ rounded(np.asarray(host, np.float32), kind).T
    got = product(Tensor(h), w).numpy()
    assert got.shape == (rows, N) and got.dtype == np.float32
    # float32 sums of exact products; on a device without tensor cores each product is rounded to half first
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-3 * np.abs(expected).max())


CPU_KINDS = ("F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K")  # clang here has no __bf16 arithmetic: BF16 off the CPU only


@pytest.mark.parametrize("kind", CPU_KINDS + (() if Device.DEFAULT == "CPU" else ("BF16",)))
@pytest.mark.parametrize("words", [True, False])
def test_the_kernel_equals_the_product_of_half_inputs(kind, words):
    """On the test device: the CPU (tinygrad's own opts), or a GPU's tensor cores (benchmarks/gpu_run.sh check)."""
    tensor_cores = has_tensor_cores(Device.DEFAULT, dtypes.bfloat16 if kind == "BF16" else dtypes.half)
    for rows in ROWS:
        check_product(kind, words, rows, lambda h, w: gpu_gemm(h, w, tensor_cores))


@pytest.mark.parametrize("transform", ["norm", "swiglu"])
def test_rows_taken_through_the_norm_or_swiglu_as_they_are_loaded(transform):
    """workers/product_ends.py: the GEMM (half inputs) and the matvec (float32) multiply the transformed rows."""
    rng = np.random.default_rng(5)
    host = host_weight("Q8_0", rng)
    weight = np.asarray(host, np.float64)
    gemm = lambda h, w, rows_in: gpu_gemm(h, w, has_tensor_cores(Device.DEFAULT), rows_in)  # noqa: E731
    matvec = lambda h, w, rows_in: gpu_matvec(h, w, None, rows_in)  # noqa: E731 (the CPU: without the GPU layout)
    for rows, product, round_inputs in ((ROWS[0], gemm, True), (2, matvec, False)):
        w = DeviceWeight.from_host(host, words=True)
        if transform == "norm":
            h, inv, scale = (rng.standard_normal(shape).astype(np.float32) for shape in ((rows, K), (rows, 1), (K,)))
            x, rows_in = (h * inv) * scale, RowInput(norm=(Tensor(inv), Tensor(scale)))
        else:
            h = rng.standard_normal((rows, 2 * K)).astype(np.float32)
            gate, up = h[:, :K].astype(np.float64), h[:, K:]
            x, rows_in = gate / (1 + np.exp(-gate)) * up, RowInput(swiglu=True)
        expected = (rounded(x, "Q8_0") @ rounded(weight, "Q8_0").T) if round_inputs else x @ weight.T
        got = product(Tensor(h), w, rows_in).numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=(2e-3 if round_inputs else 1e-5) * np.abs(expected).max())


@pytest.mark.parametrize("kind,gpu_kind", [("Q5_K", "Q5_K32"), ("Q6_K", "Q6_K32")])
def test_the_kernel_reads_k_quants_regrouped_per_block(kind, gpu_kind):
    """Q5_K and Q6_K as a GPU holds them (words: each 32-block's codes by themselves) in the kernel itself."""
    tensor_cores = has_tensor_cores(Device.DEFAULT)
    for rows in ROWS:
        check_product(kind, True, rows, lambda h, w: gpu_gemm(h, w, tensor_cores) if w.kind == gpu_kind else None)


def test_which_weights_the_kernel_reads():
    h = Tensor.zeros(16, K)
    for kind in (*CPU_KINDS, "BF16", "Q5_K", "Q6_K"):
        assert gpu_gemm_fits(h, DeviceWeight.from_host(host_weight(kind, np.random.default_rng(0)), words=True))
    for kind in ("Q6_K", "Q8_16"):  # the half scratch's (Q6_K as the file has it: the CPU's layout)
        assert not gpu_gemm_fits(h, DeviceWeight(kind, (Tensor.zeros(N, K // 32, 16, dtype=dtypes.uint8),)))
    assert not gpu_gemm_fits(h, DeviceWeight("F32", (Tensor.zeros(N, K),)))  # float32 stays float32
    assert not gpu_gemm_fits(Tensor.zeros(16, 48), DeviceWeight("F16", (Tensor.zeros(N, 48).half(),)))  # no whole blocks


def test_the_half_scratch_product():
    for rows in ROWS:
        check_product("Q6_K", False, rows, lambda h, w: half_scratch_product(h, w, has_tensor_cores(Device.DEFAULT)))


def tiny_runner(dim: int, n_layers: int = 2, max_num_seqs: int = 2):
    """A ModelRunner of a Q8_0 llama (the embedding float32) under the tinygrad kernel set: 8 blocks of 16."""
    from tests.workers.dense_reference import random_llama
    from tinyvllm.protocol.model_config import ModelConfig
    from tinyvllm.workers.kv_cache import PagedKVCache
    from tinyvllm.workers.model import Transformer
    from tinyvllm.workers.model_runner import ModelRunner

    cfg = ModelConfig(arch="llama", vocab_size=89, dim=dim, n_layers=n_layers, n_heads=4, n_kv_heads=2,
                      head_dim=dim // 4, ffn_dim=2 * dim, rope_theta=10000.0, rms_eps=1e-5, max_context=64,
                      tie_embeddings=False)
    weights = random_llama(cfg)
    for name, a in weights.items():
        if a.ndim == 2 and name != "token_embd.weight":
            weights[name] = QuantizedArray.from_raw("Q8_0", np.frombuffer(quantize(a, "Q8_0"), np.uint8), a.shape)
    return ModelRunner(Transformer(cfg, weights, 64, kernels="tinygrad"), PagedKVCache(cfg, 8, 16),
                       max_num_seqs=max_num_seqs, max_model_len=64, max_num_batched_tokens=16)


def tiny_model_step(dim: int = 32) -> tuple[int, float]:
    """A 16-token prompt's greedy token and its logprob from a 2-layer Q8_0 model under the tinygrad kernel set: on
    an emulated GPU the jitted step runs the gemm and attention custom kernels inside the layer functions."""
    from tinyvllm.protocol.messages import NewRequestData, StepPlan
    from tinyvllm.protocol.sampling import SamplingParams

    request = NewRequestData("a", list(range(3, 19)), SamplingParams(temperature=0, max_tokens=2, logprobs=1), [0], 0, 16)
    result = tiny_runner(dim).execute(StepPlan(1, [request], [], []))
    return result.sampled_token_ids[0], result.logprobs[0].logprob


def decode_step_kernels(n_layers: int, batch: int) -> int:
    """Kernels a captured decode step of `batch` sequences launches (run under DEV=NULL:CUDA: nothing runs)."""
    from tinygrad import GlobalCounters

    from tinyvllm.protocol.messages import CachedRequestData, NewRequestData, StepPlan
    from tinyvllm.protocol.sampling import SamplingParams

    runner, ids = tiny_runner(512, n_layers, max_num_seqs=batch), [f"r{i}" for i in range(batch)]
    runner.execute(StepPlan(1, [NewRequestData(r, [3, 4, 5], SamplingParams(temperature=0, max_tokens=9), [i], 0, 3)
                                for i, r in enumerate(ids)], [], []))
    for step in range(3):  # captured on the second
        GlobalCounters.reset()
        runner.execute(StepPlan(2 + step, [], [CachedRequestData(r, [], 3 + step, 1, [i]) for i, r in enumerate(ids)], []))
    return GlobalCounters.kernel_count


def kernels_per_decode_layer() -> None:
    """Run with DEV=NULL:CUDA:sm_90: the kernels one layer adds to a decode step, on the matvecs (2 sequences) and on
    the tensor-core GEMM (8)."""
    from tests.helpers.null_cuda import use_source_only_cuda
    use_source_only_cuda()
    for batch in (2, 8):
        print("per layer", batch, decode_step_kernels(2, batch) - decode_step_kernels(1, batch), flush=True)


def emulated_gpu_checks() -> None:
    """Run with DEV=PYTHON::sm_80: every product through `linear` as the model calls it, on tensor cores."""
    import tinygrad.runtime.ops_python as ops_python
    from tinygrad.uop.ops import Ops

    from tinyvllm.workers.kernel_set import kernel_choice
    from tinyvllm.workers.model import linear

    programs: list[bool] = []  # per program made: whether it multiplies on tensor cores
    make = ops_python.PythonProgram.__init__

    def recording(self, dev, obj):
        make(self, dev, obj)
        if any(u.op in (Ops.REDUCE, Ops.WMMA) for u in self.uops) or any(u.op is Ops.RANGE for u in self.uops):
            programs.append(any(u.op is Ops.WMMA for u in self.uops))
    ops_python.PythonProgram.__init__ = recording

    kernels = kernel_choice(Device.DEFAULT, "tinygrad")
    assert kernels.tensor_cores and kernels.bfloat16_tensor_cores and kernels.gpu_matvec, kernels
    cases = [(kind, True, ROWS[1]) for kind in (*CPU_KINDS, "BF16", "Q5_K", "Q6_K")] + [("Q8_0", True, ROWS[0])]
    # the kinds with words as plain arrays too, at 32 rows (24 would find the scratch's F16 program cached)
    for kind, words, rows in cases + [("F16", False, 32), ("Q8_0", False, 32)]:
        programs.clear()
        check_product(kind, words, rows, lambda h, w: linear(h, w, kernels))
        assert programs and programs[-1], f"{kind} words={words} rows={rows}: no WMMA in {programs}"
        print(kind, words, rows, "WMMA", flush=True)
    for K_, N_ in ((256, 40), (896, 24)):  # K padded to the tensor cores' 16 blocks; rows not whole tiles
        programs.clear()
        check_product("Q8_0", True, 24, lambda h, w: linear(h, w, kernels), K=K_, N=N_)
        assert programs and programs[-1], f"K={K_} N={N_}: no WMMA in {programs}"
        print("Q8_0", K_, N_, "WMMA", flush=True)
    programs.clear()  # 3 blocks, under TENSOR_CORE_MIN_K: tinygrad's own opts, as on the CPU
    check_product("Q8_0", True, 24, lambda h, w: linear(h, w, kernels), K=96)
    assert programs and not any(programs), programs
    from tinyvllm.workers import paged_products
    paged_products.SCORES_BUFFER_MAX_BYTES = 0  # the 16-token prompt through the one-kernel attention, GPU opts
    fused, traced = paged_products._fused_kernel, []
    paged_products._fused_kernel = lambda *args: traced.append(1) or fused(*args)
    print("step", *tiny_model_step())
    assert traced, "the one-kernel attention was not in the step"


def cuda_render_checks() -> None:
    """Run with DEV=NULL:CUDA:sm_90 (tests/helpers/null_cuda.py): every product's CUDA source holds the tensor cores'
    mma instruction, and a whole jitted model step renders (nothing runs: NULL)."""
    from tests.helpers.null_cuda import SOURCES, use_source_only_cuda
    use_source_only_cuda()
    from tinyvllm.workers.kernel_set import kernel_choice
    from tinyvllm.workers.model import linear

    kernels = kernel_choice(Device.DEFAULT, "tinygrad")
    assert kernels.tensor_cores and kernels.gpu_matvec, kernels
    for kind in (*CPU_KINDS, "BF16", "Q5_K", "Q6_K"):
        SOURCES.clear()
        w = DeviceWeight.from_host(host_weight(kind, np.random.default_rng(0)), words=True)
        linear(Tensor.empty(24, K), w, kernels).realize()
        assert "mma.sync.aligned.m16n8k16" in SOURCES[-1], f"{kind}: {SOURCES[-1]}"
        print(kind, "mma", flush=True)
    SOURCES.clear()
    tiny_model_step(dim=512)  # K of 512 and 1024: the step's products on tensor cores
    gemms = [s for s in SOURCES if "gemm_q8_0" in s]  # a prompt's step: products of 16 rows
    assert gemms and all("mma.sync.aligned" in s for s in gemms), len(SOURCES)
    assert any("paged_scores" in s for s in SOURCES) and any("paged_weighted_values" in s for s in SOURCES)
    print("step rendered", len(SOURCES), flush=True)
    from tinyvllm.workers import paged_products
    paged_products.SCORES_BUFFER_MAX_BYTES = 0
    SOURCES.clear()
    tiny_model_step(dim=512)  # the prompt through the one-kernel attention: head_dim 128 upcast in two steps
    assert any("paged_attention_16_4_128" in s for s in SOURCES) and not any("paged_scores" in s for s in SOURCES)


def cuda_without_bfloat16_tensor_cores() -> None:
    """Run with DEV=NULL:CUDA:sm_75 (half tensor cores, none for bfloat16): a BF16 product renders without them."""
    from tests.helpers.null_cuda import SOURCES, use_source_only_cuda
    use_source_only_cuda()
    from tinyvllm.workers.kernel_set import kernel_choice
    from tinyvllm.workers.model import linear

    kernels = kernel_choice(Device.DEFAULT, "tinygrad")
    assert kernels.tensor_cores and not kernels.bfloat16_tensor_cores, kernels
    for kind, mma in (("F16", True), ("BF16", False)):
        SOURCES.clear()
        w = DeviceWeight.from_host(host_weight(kind, np.random.default_rng(0)), words=True)
        linear(Tensor.empty(24, K), w, kernels).realize()
        assert ("mma.sync" in SOURCES[-1]) == mma, (kind, SOURCES[-1])
    print("sm_75 rendered", flush=True)


@pytest.mark.parametrize("arch,checks,printed", [("sm_90", "cuda_render_checks", "step rendered"),
                                                 ("sm_75", "cuda_without_bfloat16_tensor_cores", "sm_75 rendered")])
def test_cuda_renders_tensor_core_products(arch, checks, printed):
    env = {**os.environ, "DEV": f"NULL:CUDA:{arch}", "PARALLEL": "0", "NULL_ALLOW_COPYOUT": "1",
           "PYTHONPATH": REPO_PATH}
    run = subprocess.run([sys.executable, "-c", f"from tests.workers.test_gpu_gemm import {checks} as c; c()"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert printed in run.stdout and (arch != "sm_90" or run.stdout.count(" mma") == 8), run.stdout


def test_a_decode_layer_is_15_kernels():
    """An RMSNorm reduction and one product for q, k and v (their weights joined, the norm applied in the product),
    two RoPE kernels, the cache write (converting to the cache's dtype inside), four of attention, the output
    product and the residual add, the second norm's reduction, one gate|up product, the down product (SwiGLU applied
    as it loads its rows) and its add: 15 (26 before the joins and fusions; docs/BENCHMARKS.md)."""
    env = {**os.environ, "DEV": "NULL:CUDA:sm_90", "PARALLEL": "0", "NULL_ALLOW_COPYOUT": "1", "JIT": "2",
           "PYTHONPATH": REPO_PATH}
    run = subprocess.run([sys.executable, "-c", "from tests.workers.test_gpu_gemm import kernels_per_decode_layer as c; c()"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    counts = {int(b): int(n) for _, _, b, n in (line.split() for line in run.stdout.splitlines() if line.startswith("per layer"))}
    assert counts == {2: 15, 8: 15}, run.stdout


def test_on_emulated_tensor_cores():
    env = {**os.environ, "DEV": "PYTHON::sm_80", "PYTHONPATH": REPO_PATH}
    run = subprocess.run([sys.executable, "-c", "from tests.workers.test_gpu_gemm import emulated_gpu_checks as c; c()"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert run.stdout.count("WMMA") == 8 + 1 + 2 + 2, run.stdout
    token, logprob = next(line.split()[1:] for line in run.stdout.splitlines() if line.startswith("step "))
    with configured("tinygrad"):
        cpu_token, cpu_logprob = tiny_model_step()  # float32 products here
    assert int(token) == cpu_token and abs(float(logprob) - cpu_logprob) < 1e-2, (token, logprob, cpu_token, cpu_logprob)
