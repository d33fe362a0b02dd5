"""The mixture-of-experts variants of workers/c/matvec.c and matvec_i8.c (EXPERTS): each row of h times the rows of
its own expert in a weight holding every expert's rows one after another equals the plain kernel's product with that
expert's rows alone (matvec_i8: bit for bit against the numpy model), on the native target and the baseline, core by
core; through tinygrad too (workers/cpu_matvec.cpu_expert_matvec)."""
import ctypes

import numpy as np
import pytest
from tinygrad import Tensor

from tests.workers.int8_matvec_model import int8_matvec
from tests.workers.test_c_kernel_builds import CORES
from tests.workers.test_cpu_matmul import KINDS, N, weights  # noqa: F401 (weights: the fixture)
from tests.workers.test_int8_matvec import INT8_KINDS, activations
from tinyvllm.workers.c_kernel import shared_library
from tinyvllm.workers.cpu_matvec import HALF_SCALE_KINDS, cpu_expert_matvec

N_EXPERTS = 4
EXPERT_ROWS = N // N_EXPERTS  # 12
# a row per (token, expert) pair; matvec_i8 takes an expert's rows 8 at a time: expert 2's 10 rows go as 8 and 2
ROW_EXPERTS = np.array([2, 0, 3, 2, 1, 2, 2, 2, 3, 2, 2, 2, 2, 2], np.int32)
TARGETS = {"native": ("-march=native",), "baseline": ()}


def run_expert_kernel(kernel: str, flags: tuple[str, ...], kind: str, h: np.ndarray, parts: list[np.ndarray]):
    rows, k = h.shape
    half_scales = kind in HALF_SCALE_KINDS and parts[1].dtype == np.float16
    defines = (f"-DROWS={rows}", f"-DCOLS={EXPERT_ROWS}", f"-DK={k}", f"-DCORES={CORES}", f"-DWEIGHT_{kind}",
               "-DEXPERTS", f"-DN_EXPERTS={N_EXPERTS}", *(("-DSCALES_F16",) if half_scales else ()))
    entry = getattr(ctypes.CDLL(str(shared_library(f"{kernel}.c", (*flags, *defines)))), kernel)
    out = np.full((rows, EXPERT_ROWS), np.nan, np.float32)
    pointers = [a.ctypes.data_as(ctypes.c_void_p) for a in (out, h, ROW_EXPERTS, *parts)]
    for core in range(CORES):
        entry(*pointers, ctypes.c_int(core))
    return out


def expert_parts(parts: list[np.ndarray], expert: int) -> list[np.ndarray]:
    return [np.ascontiguousarray(p[expert * EXPERT_ROWS:(expert + 1) * EXPERT_ROWS]) for p in parts]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", INT8_KINDS)
def test_int8_expert_rows_have_the_models_bits(weights, target, kind):  # noqa: F811
    weight, dense = weights[kind]
    parts = [np.ascontiguousarray(p.numpy()) for p in weight.parts]
    h = activations(len(ROW_EXPERTS), dense.shape[1])
    got = run_expert_kernel("matvec_i8", TARGETS[target], kind, h, parts)
    for t, expert in enumerate(ROW_EXPERTS):
        np.testing.assert_array_equal(got[t], int8_matvec(kind, h[t:t + 1], expert_parts(parts, expert))[0])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", KINDS)
def test_float_expert_rows_equal_numpy(weights, target, kind):  # noqa: F811
    weight, dense = weights[kind]
    parts = [np.ascontiguousarray(p.numpy()) for p in weight.parts]
    h = np.random.default_rng(5).standard_normal((len(ROW_EXPERTS), dense.shape[1])).astype(np.float32)
    got = run_expert_kernel("matvec", TARGETS[target], kind, h, parts)
    experts = dense.astype(np.float64).reshape(N_EXPERTS, EXPERT_ROWS, -1)[ROW_EXPERTS]
    want = np.einsum("tk,tnk->tn", h.astype(np.float64), experts)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["Q4_K", "Q8_0", "F16"])
def test_through_tinygrad(weights, kind):  # noqa: F811
    weight, dense = weights[kind]
    h = np.random.default_rng(6).standard_normal((len(ROW_EXPERTS), dense.shape[1])).astype(np.float32)
    got = cpu_expert_matvec(Tensor(h), weight, Tensor(ROW_EXPERTS), EXPERT_ROWS).numpy()
    experts = dense.astype(np.float64).reshape(N_EXPERTS, EXPERT_ROWS, -1)[ROW_EXPERTS]
    np.testing.assert_allclose(got, np.einsum("tk,tnk->tn", h, experts), rtol=0, atol=1e-5 * np.abs(got).max())
