"""The int8-activation products (workers/c/matvec_i8.c for a few rows, quantize_i8.c + gemm_i8.c from
INT8_GEMM_MIN_ROWS: 3-12 on an x86 with AVX-512 VNNI, 16 on one without, 3 on ARM):
bit-exact against a numpy model of the same integer and float32 arithmetic (tests/workers/int8_matvec_model.py) on the
targets they compile for here (VNNI where the CPU has it, AVX2, the baseline's portable loop; NEON's is not built
on x86), through tinygrad too, and within the activations' quantisation error of the float32 product."""
import ctypes
import platform

import numpy as np
import pytest
from tinygrad import Tensor

from tests.workers.int8_matvec_model import int8_matvec
from tests.workers.test_c_kernel_builds import CORES, run_kernel
from tests.workers.test_cpu_matmul import K, N, weights  # noqa: F401 (weights: the fixture)
from tests.workers.test_quantized_weight import dense_attention, quantised_llama  # noqa: F401 (a fixture)
from tinyvllm.workers.c_kernel import shared_library
from tinyvllm.workers.cpu_gemm import TILE_BYTES_PER_BLOCK
from tinyvllm.workers.cpu_matvec import INT8_ACTIVATION_KINDS, cpu_matvec

TARGETS = {"native": ("-march=native",), "baseline": ()}
PANEL_SCRATCH_BYTES = 4096  # workers/c/gemm_i8.c's SCRATCH_BYTES for a tile against a panel of 32 weight rows
INT8_KINDS = ["Q4_0", "Q4_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
if platform.machine().lower() in ("x86_64", "amd64"):
    TARGETS["avx2"] = ("-march=native", "-mno-avx512f", "-mno-avxvnni")  # AVX2's maddubs path, no VNNI
    TARGETS["avx512"] = ("-march=native", "-mno-avx512vnni", "-mno-avxvnni")  # AVX-512 without VNNI (Skylake-SP)
# (target, kind): AVX-512 without VNNI differs from AVX2 only in Q6_K's matvec_i8 (its block lanes' madd)
TARGET_KINDS = [(target, kind) for target in TARGETS for kind in INT8_KINDS if target != "avx512" or kind == "Q6_K"]


def activations(rows: int, k: int = K) -> np.ndarray:
    h = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
    h[0, :32] = 0  # a block of zeros: scale 0
    h[-1, 32:64] *= 1e3  # one large block
    h[-1, 64:96] *= 1e-38  # one too small to invert: codes 0
    return h


def run_int8_gemm(flags: tuple[str, ...], kind: str, h: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
    """workers/c/quantize_i8.c, then workers/c/gemm_i8.c (built with `flags`), each core by core."""
    (rows, k), cols = h.shape, parts[0].shape[0]
    quantize = shared_library("quantize_i8.c", (*flags, f"-DROWS={rows}", f"-DK={k}", f"-DCORES={CORES}")).as_posix()
    tiles = np.zeros((rows + 3) // 4 * k // 32 * TILE_BYTES_PER_BLOCK, np.uint8)
    for core in range(CORES):
        ctypes.CDLL(quantize).quantize_i8(tiles.ctypes.data_as(ctypes.c_void_p), h.ctypes.data_as(ctypes.c_void_p),
                                          ctypes.c_int(core))
    return run_kernel("gemm_i8", flags, kind, tiles, parts, rows=rows, cols=cols, k=k)


def random_parts(kind: str, cols: int, k: int, half_scales: bool = True) -> list[np.ndarray]:
    """A DeviceWeight's parts of random blocks: codes, scales (float16 for Q4_0, Q4_1 and Q8_0 unless not
    half_scales, as from an IQ4_XS) (and Q4_1's minimums; Q4_K's and Q5_K's scale and
    minimum codes and its super-blocks' d and dmin, after Q5_K's fifth bits; Q6_K's low nibbles, high bit pairs,
    half-block scales and d; Q3_K's 2-bit codes, third bits, half-block scales and d; Q2_K's 2-bit codes, scale and
    minimum bytes, d and dmin)."""
    rng, blocks = np.random.default_rng(cols), (cols, k // 32)
    scales = (rng.standard_normal(blocks) * 0.02).astype(np.float32)
    if kind in ("Q4_K", "Q5_K"):
        fifth = [rng.integers(0, 256, (cols, k // 256, 32), dtype=np.uint8)] if kind == "Q5_K" else []
        return [rng.integers(0, 256, (*blocks, 16), dtype=np.uint8), *fifth,
                rng.integers(0, 64, (*blocks, 2), dtype=np.uint8),
                (rng.standard_normal((cols, k // 256, 2)) * 0.002).astype(np.float32)]
    if kind == "Q6_K":
        return [rng.integers(0, 256, (*blocks, 16), dtype=np.uint8), rng.integers(0, 256, (*blocks, 8), dtype=np.uint8),
                rng.integers(-128, 128, (*blocks, 2), dtype=np.int8),
                (rng.standard_normal((cols, k // 256, 1)) * 0.002).astype(np.float32)]
    if kind == "Q2_K":
        return [rng.integers(0, 256, (*blocks, 8), dtype=np.uint8), rng.integers(0, 256, (*blocks, 2), dtype=np.uint8),
                (rng.standard_normal((cols, k // 256, 2)) * 0.002).astype(np.float32)]
    if kind == "Q3_K":
        return [rng.integers(0, 256, (*blocks, 8), dtype=np.uint8), rng.integers(0, 256, (cols, k // 256, 32), dtype=np.uint8),
                rng.integers(-32, 32, (*blocks, 2), dtype=np.int8), (rng.standard_normal((cols, k // 256, 1)) * 0.002).astype(np.float32)]
    scale_dtype = np.float16 if half_scales else np.float32
    scales = scales.astype(scale_dtype)
    if kind == "Q4_0":
        return [rng.integers(0, 256, (*blocks, 16), dtype=np.uint8), scales]
    if kind == "Q4_1":
        return [rng.integers(0, 256, (*blocks, 16), dtype=np.uint8), scales, (rng.standard_normal(blocks) * 0.1).astype(scale_dtype)]
    return [rng.integers(-128, 128, (*blocks, 32), dtype=np.int8), scales]


def with_extremes(kind: str, parts: list[np.ndarray]) -> list[np.ndarray]:
    """Q8_0's most negative code, which the GGUF writer never emits (-128: 128 unsigned in the AVX2 path); Q6_K's
    codes and scales at their extremes (a half's largest sum times -128); Q3_K's too (-4 and 3 times -32 and 31);
    Q2_K's (codes 3 and 0 with scale and minimum codes 15)."""
    if kind == "Q8_0":
        parts[0] = parts[0].copy()
        parts[0][0, 0, :4] = -128
    if kind == "Q6_K":  # block 0's first half all -32 (code 0), block 1's second half all 31 (code 63)
        parts[0], parts[1], parts[2] = parts[0].copy(), parts[1].copy(), parts[2].copy()
        low, pairs = parts[0][0, :8].reshape(128), parts[1][0, :8].reshape(64)  # the first super-block's bytes
        low[:16] &= 0xF0  # block 0: low nibbles of bytes 0-31, bits 0-1 of the pairs' bytes 0-31
        pairs[:16] &= 0xFC
        low[48:64] |= 0x0F  # block 1: low nibbles of bytes 32-63, bits 2-3 of the pairs' bytes 0-31
        pairs[16:32] |= 0x0C
        parts[0][0, :8], parts[1][0, :8] = low.reshape(8, 16), pairs.reshape(8, 8)
        parts[2][0, 0, 0], parts[2][0, 1, 1] = -128, 127
    if kind == "Q3_K":  # block 0's first half all -4 (2-bit codes 0, third bits clear), block 1's second half all 3
        parts[0], parts[1], parts[2] = parts[0].copy(), parts[1].copy(), parts[2].copy()
        low = parts[0][0, :8].reshape(64)  # the first super-block's 64 bytes: block 0 bits 0-1, block 1 bits 2-3
        low[:16] &= 0xFC
        low[16:32] |= 0x0C
        parts[0][0, :8] = low.reshape(8, 8)
        parts[1][0, 0, :16] &= 0xFE
        parts[1][0, 0, 16:] |= 0x02
        parts[2][0, 0, 0], parts[2][0, 1, 1] = -32, 31
    if kind == "Q2_K":  # block 0's first half all 3, block 1's second half all 0; both halves' codes 15 and 15
        parts[0], parts[1] = parts[0].copy(), parts[1].copy()
        low = parts[0][0, :8].reshape(64)  # as Q3_K's
        low[:16] |= 0x03
        low[16:32] &= 0xF3
        parts[0][0, :8] = low.reshape(8, 8)
        parts[1][0, 0, 0] = parts[1][0, 1, 1] = 0xFF
    return parts


@pytest.mark.parametrize("target,kind", TARGET_KINDS)
@pytest.mark.parametrize("kernel,rows", [("matvec_i8", 1), ("matvec_i8", 3), ("gemm_i8", 2), ("gemm_i8", 13),
                                         ("gemm_i8", 37)])
def test_kernel_equals_the_numpy_model_bit_for_bit(weights, target, kind, kernel, rows):  # noqa: F811
    """gemm_i8 with 13 rows: 3 full tiles and a part one against panels, a tile a slab; with 37 rows (9 full tiles
    and a part one) against panels in slabs of 3, 3, 3 and 1 tiles."""
    weight, dense = weights[kind]
    parts, k = with_extremes(kind, [np.ascontiguousarray(p.numpy()) for p in weight.parts]), dense.shape[1]
    slab = 3 * k // 32 * TILE_BYTES_PER_BLOCK + (3 * PANEL_SCRATCH_BYTES if rows > 13 else 0)
    flags = TARGETS[target] + ((f"-DSLAB_BYTES={slab}",) if kernel == "gemm_i8" else ())
    run = (lambda h: run_int8_gemm(flags, kind, h, parts)) if kernel == "gemm_i8" else \
        (lambda h: run_kernel(kernel, flags, kind, h, parts, k=k))
    h = activations(rows, k)
    got = run(h)
    np.testing.assert_array_equal(got, int8_matvec(kind, h, parts))
    h[0, 100] = np.nan  # a NaN (or an infinity) makes its row's outputs NaN, as with float activations
    h[-1, 5] = np.inf
    got = run(h)
    assert np.isnan(got[0]).all() and np.isnan(got[-1]).all()
    np.testing.assert_array_equal(got, int8_matvec(kind, h, parts))


@pytest.mark.parametrize("target,kind", TARGET_KINDS)
def test_both_kernels_give_every_row_the_models_bits_on_a_larger_odd_shape(target, kind):
    """K = 544 (17 blocks: two whole groups of 8 lanes and one more), 512 (whole groups: with AVX-512 VNNI,
    matvec_i8 takes the nibble kinds and Q8_0 two weight rows' 8 blocks at a time, one block a lane) and 1056
    (gemm_i8's panels in a chunk of 32 blocks and one of 1); the K-quants 768 (3 super-blocks) and 1280 (chunks of 32 and 8 blocks); 30 columns (15 a core: a part
    panel); gemm_i8's tiles in registers (13 rows, one slab) and against panels (37 rows in one slab; 13 in slabs of
    one tile). Q4_1's and Q8_0's scales as float16 (the file's) and float32 (a repacked IQ4_XS's)."""
    shapes = [(k, True) for k in ((768, 1280) if kind.endswith("_K") else (544, 512, 1056))]
    for k, half_scales in shapes + ([(544, False), (512, False)] if kind in ("Q4_1", "Q8_0") else []):
        parts = random_parts(kind, 30, k, half_scales)
        h = np.random.default_rng(5).standard_normal((37, k)).astype(np.float32)
        np.testing.assert_array_equal(run_int8_gemm(TARGETS[target], kind, h, parts), int8_matvec(kind, h, parts))
        h = h[:13]  # 37 rows: panels, one slab; 13: tiles in registers
        want = int8_matvec(kind, h, parts)
        np.testing.assert_array_equal(run_int8_gemm(TARGETS[target], kind, h, parts), want)
        panels = (*TARGETS[target], f"-DSLAB_BYTES={k // 32 * TILE_BYTES_PER_BLOCK}")
        np.testing.assert_array_equal(run_int8_gemm(panels, kind, h, parts), want)
        for rows in (slice(0, 1), slice(11, 13)):
            got = run_kernel("matvec_i8", TARGETS[target], kind, h[rows], parts, cols=30, k=k)
            np.testing.assert_array_equal(got, want[rows])


@pytest.mark.parametrize("target", [target for target in TARGETS if target != "avx512"])
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_infinite_and_nan_half_scales_stay_so_on_every_target(target, kind):
    """A file's float16 d (or m) of inf or NaN: the kernels widen it to inf or NaN with F16C or without (the bit
    path had made them finite), as the model's float32 does."""
    parts, h = random_parts(kind, 30, 512), np.random.default_rng(6).standard_normal((5, 512)).astype(np.float32)
    parts[1] = parts[1].copy()
    parts[1][3, 0], parts[1][4, 1] = np.inf, np.nan
    want = int8_matvec(kind, h, parts)
    assert np.isnan(want[:, 4]).all() and not np.isfinite(want[:, 3]).any()
    np.testing.assert_array_equal(run_kernel("matvec_i8", TARGETS[target], kind, h[:2], parts, cols=30, k=512), want[:2])
    np.testing.assert_array_equal(run_int8_gemm(TARGETS[target], kind, h, parts), want)


def test_a_jitted_int8_product_follows_its_input(weights):  # noqa: F811
    """The captured quantize_i8 + gemm_i8 read the step's input buffer anew on every call."""
    from tinygrad import TinyJit
    from tinyvllm.workers.cpu_matmul import cpu_linear
    from tinyvllm.workers.device_input import HostInputs
    weight, _ = weights["Q4_1"]
    jit, inputs = TinyJit(lambda h: cpu_linear(h, weight, int8_activations=True).realize()), HostInputs()
    for seed in range(4):
        h = np.random.default_rng(seed).standard_normal((5, K)).astype(np.float32)
        got = jit(inputs("h", h)).numpy()
        np.testing.assert_array_equal(got, int8_matvec("Q4_1", h, [p.numpy() for p in weight.parts]))


@pytest.mark.parametrize("kind", INT8_KINDS)
def test_through_tinygrad_equals_the_model_and_stays_near_the_float_product(weights, kind):  # noqa: F811
    weight, dense = weights[kind]
    h = activations(2, dense.shape[1])
    got = cpu_matvec(Tensor(h), weight, int8_activations=True).numpy()
    np.testing.assert_array_equal(got, int8_matvec(kind, h, [p.numpy() for p in weight.parts]))
    exact = h.astype(np.float64) @ dense.T.astype(np.float64)
    # each activation moves by at most half a step of its block's scale (max |x| / 127)
    bound = np.abs(dense).astype(np.float64) @ (np.abs(h).reshape(2, -1, 32).max(-1) / 254).repeat(32, -1).T
    assert np.all(np.abs(got - exact) <= bound.T * 1.001 + 1e-4)
    assert not np.array_equal(got, cpu_matvec(Tensor(h), weight).numpy())  # it is a different path


def test_the_c_int8_set_takes_int8_at_every_row_count_and_a_row_keeps_its_bits(quantised_llama, monkeypatch):  # noqa: F811
    """c-int8: every Q4_1/Q8_0 product takes int8 activations (matvec_i8 for 1-2 rows, gemm_i8 from 3, as on ARM,
    whatever this one has: both kernels meet here), and a row's logits do not depend on the rows beside
    it: alone, with 1 or 2 more (matvec_i8, then gemm_i8) bit for bit; with 4 more within a float rounding
    (tinygrad's own kernels, norms and this test's attention, change with the shape)."""
    from tinyvllm.workers import cpu_matvec as cpu_matvec_module
    from tinyvllm.workers.model import Transformer
    monkeypatch.setattr("tinyvllm.workers.cpu_matmul.INT8_GEMM_MIN_ROWS", dict.fromkeys(INT8_ACTIVATION_KINDS, 3))
    (cfg, kept), _ = quantised_llama
    used = set()
    c_matmul = cpu_matvec_module.c_matmul
    monkeypatch.setattr(cpu_matvec_module, "c_matmul", lambda h, w, kernel, *a: used.add((kernels, h.shape[0], w.kind, kernel))
                        or c_matmul(h, w, kernel, *a))
    monkeypatch.setattr("tinyvllm.workers.cpu_gemm.c_matmul", cpu_matvec_module.c_matmul)
    first_rows = {}
    for kernels in ("c-int8", "c"):
        model = Transformer(cfg, kept, 64, kernels=kernels)
        for n in (1, 2, 3, 5):
            first_rows[kernels, n] = model.forward(Tensor([1] + [7] * (n - 1)), Tensor.arange(n), dense_attention(cfg)).numpy()[0]
    int8 = {(k, rows, kind, kernel) for k, rows, kind, kernel in used if kernel.endswith("_i8")}
    assert int8 == {("c-int8", rows, kind, "matvec_i8" if rows <= 2 else "gemm_i8") for rows in (1, 2, 3, 5)
                    for kind in ("Q4_1", "Q8_0")}
    assert ("c-int8", 1, "F16", "matvec") in used and ("c", 1, "Q4_1", "matvec") in used  # v: F16, float kernels
    for n in (2, 3):
        np.testing.assert_array_equal(first_rows["c-int8", n], first_rows["c-int8", 1])
    np.testing.assert_allclose(first_rows["c-int8", 5], first_rows["c-int8", 1], rtol=0, atol=1e-6)


def test_the_tiles_take_over_from_3_to_12_rows_on_an_x86_with_avx512_vnni_and_16_on_one_without():
    """Measured on each kind of CPU (workers/cpu_gemm.py): the row count where gemm_i8 overtakes matvec_i8."""
    from tinyvllm.workers.cpu_gemm import int8_gemm_min_rows
    vnni = "fpu sse2 avx2 avx512f avx512_vnni"
    assert [int8_gemm_min_rows(vnni, "x86_64", kind) for kind in INT8_ACTIVATION_KINDS] == [10, 10, 6, 6, 12, 12, 12, 3]
    assert int8_gemm_min_rows("fpu avx2 avx_vnni", "x86_64", "Q4_K") == 16  # 256-bit VNNI alone: AVX2's paths
    assert int8_gemm_min_rows("fpu sse2 fma avx2 f16c", "x86_64", "Q4_K") == 16
    assert int8_gemm_min_rows("", "aarch64", "Q6_K") == 3  # NEON's sdot in both kernels


def test_the_slab_is_half_a_cores_share_of_its_l2(tmp_path):
    """workers/cpu_gemm.py reads the L2's size from sysfs and divides it by the CPUs sharing it; a cache it cannot
    read (an empty size, none at level 2) gives None, so gemm_i8 takes its default."""
    from tinyvllm.workers.cpu_gemm import core_l2_bytes

    def cache(name: str, level: str, kind: str, size: str, shared: str | None = None):
        (tmp_path / name).mkdir()
        for field, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            if value is not None:
                (tmp_path / name / field).write_text(value + "\n")

    cache("index0", "1", "Data", "48K", "0")
    cache("index1", "1", "Instruction", "32K", "0")
    assert core_l2_bytes(tmp_path) is None
    cache("index2", "2", "Unified", "2048K")
    assert core_l2_bytes(tmp_path) == 2 << 20
    (tmp_path / "index2" / "shared_cpu_list").write_text("0-1,4\n")
    (tmp_path / "index2" / "size").write_text("3M\n")
    assert core_l2_bytes(tmp_path) == 1 << 20
    (tmp_path / "index2" / "size").write_text("\n")
    assert core_l2_bytes(tmp_path) is None
