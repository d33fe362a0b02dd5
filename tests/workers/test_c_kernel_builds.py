"""The matmul kernels (workers/c/matvec.c, gemm.c) built for the vector widths CI's AVX-512 machine never compiles
them for: AVX2 (matvec's 8-row tiles, gemm's 4x2 tiles with lane sums) and the target's baseline (SSE2 on x86-64,
NEON on arm64). Each is built with the host's clang into a shared library, called through ctypes core by core,
and compared with numpy's product on the dequantised weight. AMX stays off: these CPUs advertise it but fault."""
import ctypes
import platform

import numpy as np
import pytest

from tests.workers.test_cpu_matmul import K, N, weights  # noqa: F401 (weights: the fixture)
from tinyvllm.workers.c_kernel import shared_library

CORES = 2
TARGETS = {"baseline": ()}
if platform.machine().lower() in ("x86_64", "amd64"):
    TARGETS["avx2"] = ("-mavx2", "-mfma", "-mno-avx512f")


def run_kernel(kernel: str, flags: tuple[str, ...], kind: str, h: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
    defines = (f"-DROWS={h.shape[0]}", f"-DCOLS={N}", f"-DK={K}", f"-DCORES={CORES}", f"-DWEIGHT_{kind}")
    entry = getattr(ctypes.CDLL(str(shared_library(f"{kernel}.c", (*flags, *defines)))), kernel)
    out = np.full((h.shape[0], N), np.nan, np.float32)
    pointers = [a.ctypes.data_as(ctypes.c_void_p) for a in (out, h, *parts)]
    for core in range(CORES):
        entry(*pointers, ctypes.c_int(core))
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ["F32", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("kernel,rows", [("matvec", 3), ("matvec", 11), ("gemm", 4), ("gemm", 13)])
def test_kernel_built_for_target_equals_numpy(weights, target, kind, kernel, rows):  # noqa: F811
    weight, dense = weights[kind]
    parts = [np.ascontiguousarray(p.numpy()) for p in weight.parts]
    h = np.random.default_rng(rows).standard_normal((rows, K)).astype(np.float32)
    got = run_kernel(kernel, TARGETS[target], kind, h, parts)
    want = h.astype(np.float64) @ dense.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
