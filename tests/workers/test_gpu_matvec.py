"""workers/gpu_matvec.py: the decode matvec kernels compute h @ w.T of the dequantised weight (F16, Q8_0, Q4_0, Q4_1,
Q4_K, Q5_K and Q6_K as a GPU holds them),
without the GPU layout on the CPU and with it (groups, locals, upcasts) on tinygrad's
PYTHON device, which emulates local memory; on a GPU (benchmarks/gpu_run.sh check) on the real device too."""
import numpy as np
import pytest
from tinygrad import Device, Tensor, dtypes

from tests.helpers.gguf_writer import quantize, random_blocks
from tinyvllm.protocol.kernel_choice import MatvecLayout
from tinyvllm.workers.gpu_matvec import gpu_matvec, gpu_matvec_device, gpu_matvec_fits
from tinyvllm.workers.quantized_weight import DeviceWeight, QuantizedArray

N = 32


def host_weight(kind: str, x: np.ndarray):
    if kind in ("Q4_K", "Q5_K", "Q6_K"):  # random valid super-blocks (the writer does not quantise K-quants)
        return QuantizedArray(kind, random_blocks(kind, (x.shape[0], x.shape[1] // 256), np.random.default_rng(1), 1e-3))
    if kind == "F16":
        return x.astype(np.float16)
    return QuantizedArray.from_raw(kind, np.frombuffer(quantize(x, kind), np.uint8), x.shape)


@pytest.mark.parametrize("device", [Device.DEFAULT, "PYTHON"])
@pytest.mark.parametrize("kind", ["F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("K", [256, 96])  # 8 blocks a row: 8 threads each; 3 blocks: the group shrinks to 1
def test_matvec_equals_the_dequantised_product(kind, device, K):
    if kind in ("Q4_K", "Q5_K", "Q6_K") and K % 256:
        K = 768  # whole super-blocks: 24 blocks, a group of 8 threads over 3 super-blocks
    rng = np.random.default_rng(0)
    host = host_weight(kind, rng.standard_normal((N, K)).astype(np.float32))
    reference_weight = np.asarray(host, dtype=np.float32)
    on_gpu = DeviceWeight.from_host(host, words=True)  # Q5_K, Q6_K: regrouped per 32-block (Q5_K32, Q6_K32)
    w = DeviceWeight(on_gpu.kind, tuple(p.to(device).realize() for p in on_gpu.parts))
    layout = MatvecLayout() if device == "PYTHON" or gpu_matvec_device(Device.DEFAULT) else None
    for rows in (1, 4):
        h = rng.standard_normal((rows, K)).astype(np.float32)
        assert gpu_matvec_fits(Tensor(h, device=device), w)
        got = gpu_matvec(Tensor(h, device=device), w, layout).numpy()
        np.testing.assert_allclose(got, h @ reference_weight.T, rtol=0, atol=1e-4)


def test_only_decode_rows_of_dequantised_weights_fit():
    K = 64
    h = Tensor.zeros(1, K)
    assert not gpu_matvec_fits(h, DeviceWeight("F32", (Tensor.zeros(N, K),)))  # tinygrad's own matvec layout
    words = lambda rows: Tensor.zeros(rows, K // 32, 16, dtype=dtypes.uint32)  # noqa: E731
    assert gpu_matvec_fits(h, DeviceWeight("F16", (words(N),)))
    assert not gpu_matvec_fits(Tensor.zeros(8, K), DeviceWeight("F16", (words(N),)))
    assert not gpu_matvec_fits(h, DeviceWeight("F16", (words(N + 8),)))  # rows not whole groups
    assert not gpu_matvec_fits(h, DeviceWeight("F16", (Tensor.zeros(N, K).half(),)))  # not in words
