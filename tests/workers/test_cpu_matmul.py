"""The CPU backend's matmul kernels (workers/cpu_matmul.py): h @ w.T for float32, Q4_1 and Q8_0 weights equals
numpy's product on the dequantised weight at every row count a step can have, the CPU device renders with the
reassociation pragma, and the switch turns both off."""
import numpy as np
import pytest
from tinygrad import Device, Tensor
from tinygrad.engine.realize import to_program_cache
from tinygrad.uop.ops import Ops

from tests.helpers.gguf_writer import write_gguf
from tests.workers.test_quantized_weight import awkward_matrix
from tinyvllm.workers.cpu_matmul import (CPU_KERNELS_ENV, REASSOCIATE_PRAGMA,
                                ReassociatingClangRenderer, cpu_linear, upcast_rows, use_cpu_kernels)
from tinyvllm.protocol.gguf_file import GGUFFile
from tinyvllm.workers.quantized_weight import DeviceWeight, QuantizedArray

N, K = 48, 160


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    x = awkward_matrix(np.random.default_rng(0), N, K)
    path = tmp_path_factory.mktemp("q") / "q.gguf"
    gguf = GGUFFile(write_gguf(path, {"general.architecture": "test"}, {t: (x, t) for t in ("Q4_1", "Q8_0")}))
    out = {"F32": (DeviceWeight.from_host(x), x)}
    for t in ("Q4_1", "Q8_0"):
        host = QuantizedArray.from_raw(t, gguf.raw(t), gguf.tensor_shape(t))
        out[t] = (DeviceWeight.from_host(host), np.asarray(host))
    return out


@pytest.mark.parametrize("kind", ["F32", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 3, 4, 8, 16, 42])  # 1, 3: cpu_matvec; from 4: cpu_gemm (42: a part tile)
def test_cpu_linear_equals_numpy(weights, kind, rows):
    assert use_cpu_kernels(Device.DEFAULT), "the test suite runs on tinygrad's CPU backend"
    weight, dense = weights[kind]
    assert weight.kind == kind
    h = np.random.default_rng(rows).standard_normal((rows, K)).astype(np.float32)
    got = cpu_linear(Tensor(h), weight).numpy()
    want = h.astype(np.float64) @ dense.T.astype(np.float64)
    assert got.shape == (rows, N)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_upcast_is_the_largest_power_of_two_dividing_the_rows():
    assert [upcast_rows(r) for r in (1, 2, 3, 6, 8, 12, 16, 48, 512)] == [1, 2, 1, 2, 8, 4, 16, 16, 16]


def test_cpu_device_renders_with_the_reassociation_pragma(weights):
    assert use_cpu_kernels("CPU") and use_cpu_kernels("CPU")  # idempotent
    assert isinstance(Device["CPU"].renderer, ReassociatingClangRenderer)
    assert Device["CPU"].renderers.count(ReassociatingClangRenderer) == 1
    # two new kernels in one realize: tinygrad compiles them in its spawned worker pool where it has one
    odd_k = 40  # rows of whole 32-blocks take the C kernels; this one takes tinygrad's float32 kernel
    h, w = Tensor(np.ones((5, odd_k), np.float32)).realize(), DeviceWeight.from_host(np.ones((N, odd_k), np.float32))
    before = set(to_program_cache)
    Tensor.realize(cpu_linear(h, w), (h * 7).sum(1))
    sources = {p.src[0].arg.name: p.src[2].arg for key, p in to_program_cache.items()
               if key not in before and p.src[0].arg is not None and p.src[2].op is Ops.SOURCE}
    assert "matmul_f32_5_48" in sources and len(sources) >= 2
    assert all(src.startswith(REASSOCIATE_PRAGMA) for src in sources.values())


def test_switch_and_other_devices_keep_tinygrads_kernels(monkeypatch):
    assert not use_cpu_kernels("NULL") and not use_cpu_kernels("CUDA")
    monkeypatch.setenv(CPU_KERNELS_ENV, "0")
    assert not use_cpu_kernels("CPU")
