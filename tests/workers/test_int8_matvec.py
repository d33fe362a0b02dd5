"""workers/c/matvec_i8.c, the decode matvec with int8 activations: bit-exact against a numpy model of the same
integer and float32 arithmetic (tests/workers/int8_matvec_model.py) on the targets it compiles for here
(VNNI where the CPU has it, AVX2, the baseline's portable loop; NEON's is not built on x86), through tinygrad
too, and within the activations' quantisation error of the float32 product."""
import platform

import numpy as np
import pytest
from tinygrad import Tensor

from tests.workers.int8_matvec_model import int8_matvec
from tests.workers.test_c_kernel_builds import run_kernel
from tests.workers.test_cpu_matmul import K, N, weights  # noqa: F401 (weights: the fixture)
from tests.workers.test_quantized_weight import dense_attention, quantised_llama  # noqa: F401 (a fixture)
from tinyvllm.workers.cpu_matvec import cpu_matvec

TARGETS = {"native": ("-march=native",), "baseline": ()}
if platform.machine().lower() in ("x86_64", "amd64"):
    TARGETS["avx2"] = ("-march=native", "-mno-avx512f", "-mno-avxvnni")  # AVX2's maddubs path, no VNNI


def activations(rows: int) -> np.ndarray:
    h = np.random.default_rng(rows).standard_normal((rows, K)).astype(np.float32)
    h[0, :32] = 0  # a block of zeros: scale 0
    h[-1, 32:64] *= 1e3  # one large block
    h[-1, 64:96] *= 1e-38  # one too small to invert: codes 0
    return h


def with_extremes(kind: str, parts: list[np.ndarray]) -> list[np.ndarray]:
    """Q8_0's most negative code, which the GGUF writer never emits (-128: 128 unsigned in the AVX2 path)."""
    if kind == "Q8_0":
        parts[0] = parts[0].copy()
        parts[0][0, 0, :4] = -128
    return parts


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 3])  # the kernel takes any row count; cpu_matvec uses it up to INT8_MAX_ROWS
def test_kernel_equals_the_numpy_model_bit_for_bit(weights, target, kind, rows):  # noqa: F811
    weight, _ = weights[kind]
    parts = with_extremes(kind, [np.ascontiguousarray(p.numpy()) for p in weight.parts])
    h = activations(rows)
    got = run_kernel("matvec_i8", TARGETS[target], kind, h, parts)
    np.testing.assert_array_equal(got, int8_matvec(kind, h, parts))
    h[0, 100] = np.nan  # a NaN (or an infinity) makes its row's outputs NaN, as with float activations
    h[-1, 5] = np.inf
    got = run_kernel("matvec_i8", TARGETS[target], kind, h, parts)
    assert np.isnan(got[0]).all() and np.isnan(got[-1]).all()
    np.testing.assert_array_equal(got, int8_matvec(kind, h, parts))


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_through_tinygrad_equals_the_model_and_stays_near_the_float_product(weights, kind):  # noqa: F811
    weight, dense = weights[kind]
    h = activations(2)
    got = cpu_matvec(Tensor(h), weight, int8_activations=True).numpy()
    np.testing.assert_array_equal(got, int8_matvec(kind, h, [p.numpy() for p in weight.parts]))
    exact = h.astype(np.float64) @ dense.T.astype(np.float64)
    # each activation moves by at most half a step of its block's scale (max |x| / 127)
    bound = np.abs(dense).astype(np.float64) @ (np.abs(h).reshape(2, -1, 32).max(-1) / 254).repeat(32, -1).T
    assert np.all(np.abs(got - exact) <= bound.T * 1.001 + 1e-4)
    assert not np.array_equal(got, cpu_matvec(Tensor(h), weight).numpy())  # it is a different path


def test_the_c_int8_set_takes_int8_for_one_and_two_rows_only(quantised_llama, monkeypatch):  # noqa: F811
    from tinyvllm.workers import cpu_matvec as cpu_matvec_module
    from tinyvllm.workers.model import Transformer
    (cfg, kept), _ = quantised_llama
    used = set()
    c_matmul = cpu_matvec_module.c_matmul
    monkeypatch.setattr(cpu_matvec_module, "c_matmul", lambda h, w, kernel: used.add((kernels, h.shape[0], w.kind, kernel))
                        or c_matmul(h, w, kernel))
    for kernels in ("c-int8", "c"):
        model = Transformer(cfg, kept, 64, kernels=kernels)
        for n in (1, 2, 3):
            model.forward(Tensor([1] * n), Tensor.arange(n), dense_attention(cfg)).realize()
    int8 = {(k, rows, kind) for k, rows, kind, kernel in used if kernel == "matvec_i8"}
    assert int8 == {("c-int8", rows, kind) for rows in (1, 2) for kind in ("Q4_1", "Q8_0")}
    assert ("c-int8", 3, "Q4_1", "matvec") in used and ("c-int8", 1, "F32", "matvec") in used  # v: F16, widened
    assert ("c", 1, "Q4_1", "matvec") in used
