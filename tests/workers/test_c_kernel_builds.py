"""The matmul kernels (workers/c/matvec.c, gemm.c) built for the vector widths CI's AVX-512 machine never compiles
them for: AVX2 (matvec's 8-row tiles, gemm's 4x2 tiles with lane sums) and the target's baseline (SSE2 on x86-64,
NEON on arm64). Each is built with the host's clang into a shared library, called through ctypes core by core,
and compared with numpy's product on the dequantised weight. AMX stays off: these CPUs advertise it but fault.
The attention kernel (workers/c/attention.c) likewise, for every KV cache format it decodes."""
import ctypes
import platform

import numpy as np
import pytest

from tests.workers.test_cpu_matmul import KINDS, K, N, weights  # noqa: F401 (weights: the fixture)
from tinyvllm.workers.c_kernel import shared_library
from tinyvllm.workers.cpu_matvec import HALF_SCALE_KINDS

CORES = 2
TARGETS = {"baseline": ()}
if platform.machine().lower() in ("x86_64", "amd64"):
    TARGETS["avx2"] = ("-mavx2", "-mfma", "-mno-avx512f")


def run_kernel(kernel: str, flags: tuple[str, ...], kind: str, h: np.ndarray, parts: list[np.ndarray],
               rows: int | None = None, cols: int = N, k: int = K) -> np.ndarray:
    """out [rows, cols] of workers/c/<kernel>.c for a [cols, k] weight, reading h (its rows, or `rows` of h in
    another form)."""
    rows = h.shape[0] if rows is None else rows
    defines = (f"-DROWS={rows}", f"-DCOLS={cols}", f"-DK={k}", f"-DCORES={CORES}", f"-DWEIGHT_{kind}",
               *(("-DSCALES_F16",) if kind in HALF_SCALE_KINDS and parts[1].dtype == np.float16 else ()))
    entry = getattr(ctypes.CDLL(str(shared_library(f"{kernel}.c", (*flags, *defines)))), kernel)
    out = np.full((rows, cols), np.nan, np.float32)
    pointers = [a.ctypes.data_as(ctypes.c_void_p) for a in (out, h, *parts)]
    for core in range(CORES):
        entry(*pointers, ctypes.c_int(core))
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kernel,rows", [("matvec", 3), ("matvec", 11), ("gemm", 4), ("gemm", 13)])
def test_kernel_built_for_target_equals_numpy(weights, target, kind, kernel, rows):  # noqa: F811
    weight, dense = weights[kind]
    parts = [np.ascontiguousarray(p.numpy()) for p in weight.parts]
    h = np.random.default_rng(rows).standard_normal((rows, dense.shape[1])).astype(np.float32)
    got = run_kernel(kernel, TARGETS[target], kind, h, parts, k=dense.shape[1])
    want = h.astype(np.float64) @ dense.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8", "fp8"])
def test_attention_built_for_target_decodes_every_kv_dtype(target, dtype):
    """workers/c/attention.c with each KV format (workers/c/kv_formats.h) on the other vector widths: a decode of
    two sequences equals a float64 softmax over the values tinygrad's path decodes from the same codes."""
    from tinygrad import Tensor

    from tinyvllm.workers.cpu_attention import KV_FORMATS
    from tinyvllm.workers.kv_quant import dequantize, is_quantized, quantize
    T, H, KVH, D, BS, MAXB = 2, 4, 2, 32, 4, 3
    rng = np.random.default_rng(5)
    kv = rng.standard_normal((MAXB * T * BS, 2, KVH, D)).astype(np.float32)
    codes, scales = (None if t is None else t.contiguous().realize() for t in quantize(Tensor(kv), dtype))
    values = dequantize(codes, scales, dtype).numpy()  # from the stored codes (unrealized, tinygrad folds the casts)
    tables = rng.permutation(MAXB * T).astype(np.int32).reshape(T, MAXB)
    positions = np.array([MAXB * BS - 1, 5], np.int32)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    defines = (f"-DT={T}", f"-DH={H}", f"-DKVH={KVH}", f"-DD={D}", f"-DBS={BS}", f"-DMAXB={MAXB}", f"-DCORES={CORES}",
               f"-DSCALE={D ** -0.5!r}f", "-DWINDOW=0", "-DSOFTCAP=0.0f", f"-DKV_FORMAT={KV_FORMATS[dtype]}",
               f"-DQUANTIZED={int(is_quantized(dtype))}")
    entry = ctypes.CDLL(str(shared_library("attention.c", (*TARGETS[target], *defines)))).paged_attention
    out = np.full((T, H * D), np.nan, np.float32)
    inputs = [out, q, np.ascontiguousarray(codes.numpy())] + ([scales.numpy()] if scales is not None else []) + \
        [tables, np.arange(T, dtype=np.int32), positions]
    for core in range(CORES):
        entry(*[a.ctypes.data_as(ctypes.c_void_p) for a in inputs], ctypes.c_int(core))
    want = np.zeros((T, H, D))
    for t in range(T):
        slots = [tables[t, p // BS] * BS + p % BS for p in range(positions[t] + 1)]
        for h in range(H):
            k, v = values[slots, 0, h // (H // KVH)].astype(np.float64), values[slots, 1, h // (H // KVH)]
            e = np.exp(k @ q[t, h] / np.sqrt(D) - (k @ q[t, h] / np.sqrt(D)).max())
            want[t, h] = e @ v / e.sum()
    np.testing.assert_allclose(out, want.reshape(T, H * D), atol=2e-5, rtol=0)
