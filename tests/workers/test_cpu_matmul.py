"""The CPU backend's matmul kernels (workers/cpu_matmul.py): h @ w.T for float32, float16, bfloat16, Q4_0, Q4_1, Q8_0,
Q8_16, float8 e4m3, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights (the K-quants [N, K_SUPER]: rows of whole 256-element super-blocks) equals numpy's product on the dequantised weight at every row count a step can have. (The reassociating renderer the
"c" kernel set installs: tests/workers/test_kernel_set.py.)"""
import numpy as np
import pytest
from tinygrad import Tensor

from tests.helpers.gguf_writer import random_blocks, write_gguf
from tests.workers.test_quantized_weight import awkward_matrix
from tinyvllm.workers.cpu_matmul import cpu_linear, upcast_rows
from tinyvllm.workers.fp8_checkpoint import fp8_matrix
from tinyvllm.protocol.gguf_file import GGUFFile
from tinyvllm.workers.quantized_weight import DeviceWeight, QuantizedArray

N, K = 48, 160
K_SUPER = 512
KINDS = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q8_16", "F8_E4M3", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    x = awkward_matrix(np.random.default_rng(0), N, K)
    path = tmp_path_factory.mktemp("q") / "q.gguf"
    gguf = GGUFFile(write_gguf(path, {"general.architecture": "test"}, {t: (x, t) for t in ("Q4_0", "Q4_1", "Q8_0")}))
    out = {"F32": (DeviceWeight.from_host(x), x)}
    for t in ("Q4_0", "Q4_1", "Q8_0"):
        host = QuantizedArray.from_raw(t, gguf.raw(t), gguf.tensor_shape(t))
        out[t] = (DeviceWeight.from_host(host), np.asarray(host))
    q5_1 = QuantizedArray("Q5_1", random_blocks("Q5_1", (N, K // 32), np.random.default_rng(1)))  # as Q8_16
    out["Q8_16"] = (DeviceWeight.from_host(q5_1), np.asarray(q5_1))
    out["F16"] = (DeviceWeight.from_host(x.astype(np.float16)), x.astype(np.float16).astype(np.float32))
    bf16 = QuantizedArray("BF16", (x.view(np.uint32) >> 16).astype("<u2").view(np.uint8).reshape(N, K, 2))
    out["BF16"] = (DeviceWeight.from_host(bf16), np.asarray(bf16))
    codes = np.random.default_rng(2).integers(0, 256, (N, K), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN codes
    fp8 = fp8_matrix(codes, np.random.default_rng(3).uniform(1e-3, 1, (N, 1)).astype(np.float32), "w")
    out["F8_E4M3"] = (DeviceWeight.from_host(fp8), np.asarray(fp8))
    for seed, t in enumerate(("Q4_K", "Q6_K", "Q5_K", "Q3_K", "Q2_K"), start=4):
        host = QuantizedArray(t, random_blocks(t, (N, K_SUPER // 256), np.random.default_rng(seed)))
        out[t] = (DeviceWeight.from_host(host), np.asarray(host))
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 3, 4, 8, 16, 42])  # 1, 3: cpu_matvec; from 4: cpu_gemm (42: a part tile)
def test_cpu_linear_equals_numpy(weights, kind, rows):
    weight, dense = weights[kind]
    assert weight.kind == kind
    h = np.random.default_rng(rows).standard_normal((rows, dense.shape[1])).astype(np.float32)
    got = cpu_linear(Tensor(h), weight).numpy()
    want = h.astype(np.float64) @ dense.T.astype(np.float64)
    assert got.shape == (rows, N)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_upcast_is_the_largest_power_of_two_dividing_the_rows():
    assert [upcast_rows(r) for r in (1, 2, 3, 6, 8, 12, 16, 48, 512)] == [1, 2, 1, 2, 8, 4, 16, 16, 16]
