"""workers/cpu_swiglu.py: the C SwiGLU (workers/c/swiglu.c) equals silu(gate) * up in float64 to float32's
precision, at both ends of the exponential's range, on rows that do not fill its 16-lane vectors or split evenly
across the cores, and inside a model step: the C kernel sets run it (tests/reference: token-exact under "c")."""
import numpy as np
from tinygrad import Tensor

from tests.workers.test_quantized_weight import dense_attention, quantised_llama  # noqa: F401 (a fixture)
from tinyvllm.workers.cpu_swiglu import cpu_swiglu


def reference(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    g64 = g.astype(np.float64)
    return g64 / (1 + np.exp(-g64)) * u.astype(np.float64)


def test_swiglu_equals_float64_to_float32_precision():
    rng = np.random.default_rng(0)
    for rows, cols in ((3, 4099), (64, 1024)):  # a tail of 3 and uneven core shares; whole vectors
        g = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
        u = rng.standard_normal((rows, cols)).astype(np.float32)
        g[0, :8] = [0.0, -0.0, 80.0, -80.0, 1e-30, -1e-30, 20.0, -20.0]
        got, want = cpu_swiglu(Tensor(g), Tensor(u)).numpy(), reference(g, u)
        np.testing.assert_allclose(got, want, rtol=4e-7, atol=1e-35)


def test_swiglu_saturates_without_overflow_and_keeps_nan():
    g = np.array([[1e4, -1e4, np.inf, np.nan, -200.0, -1e30, -3e38]], np.float32)
    got = cpu_swiglu(Tensor(g), Tensor(np.ones_like(g))).numpy()[0]
    assert got[0] == 1e4 and got[2] == np.inf and np.isnan(got[3])
    assert (got[[1, 4, 5, 6]] == 0).all()  # e^x below float32's normal range is 0, as silu's limit


def test_the_c_kernel_sets_take_it_and_tinygrads_does_not(quantised_llama, monkeypatch):  # noqa: F811
    """A layer's MLP under "c" and "c-int8" runs the C SwiGLU; under "tinygrad" (what GPUs run) tinygrad's silu,
    with logits within float32 rounding of each other."""
    from tinyvllm.workers import model as model_module
    (cfg, kept), _ = quantised_llama
    used = []
    monkeypatch.setattr(model_module, "cpu_swiglu", lambda g, u: used.append(kernels) or cpu_swiglu(g, u))
    logits = {}
    for kernels in ("c", "c-int8", "tinygrad"):
        model = model_module.Transformer(cfg, kept, 64, kernels=kernels)
        logits[kernels] = model.forward(Tensor([1, 7, 9]), Tensor.arange(3), dense_attention(cfg)).numpy()
    assert set(used) == {"c", "c-int8"}
    np.testing.assert_allclose(logits["c"], logits["tinygrad"], rtol=0, atol=1e-4)
