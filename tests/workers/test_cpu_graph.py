"""The CPU backend's JIT graph (workers/cpu_graph.py): a jitted function's kernels are batched into CPUGraph,
whose C executor runs them with the same results as tinygrad's one-by-one path: every core's share of a kernel
split across cores, inputs that change between calls, symbolic variables that change between calls."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, UOp
from tinygrad.uop.ops import Ops

from tinyvllm.workers.cpu_graph import MAX_ARGS, executor
from tinyvllm.workers.cpu_matmul import cpu_linear
from tinyvllm.workers.quantized_weight import DeviceWeight


pytestmark = pytest.mark.usefixtures("c_kernel_set")  # the kernel set that installs the graph (tests/workers/conftest.py)


def graph_calls(jit) -> list:
    return [c for c in jit.captured.linear.src if c.src[0].op is Ops.CUSTOM_FUNCTION and c.src[0].arg == "graph"]


def test_a_jitted_step_runs_through_the_graph_with_split_kernels_complete():
    rng = np.random.default_rng(0)
    w = [rng.standard_normal((64, 32)).astype(np.float32) for _ in range(3)]
    weights = [DeviceWeight.from_host(x) for x in w]

    @TinyJit
    def step(h: Tensor) -> Tensor:
        for weight in weights[:2]:
            h = (cpu_linear(h, weight)[:, :32] * 0.5).relu().contiguous()
        return cpu_linear(h, weights[2]).realize()

    for call in range(4):
        h = rng.standard_normal((4, 32)).astype(np.float32)  # a new input buffer every call
        got = step(Tensor(h)).numpy()
        want = h
        for x in w[:2]:
            want = np.maximum((want @ x.T)[:, :32] * 0.5, 0)
        np.testing.assert_allclose(got, want @ w[2].T, rtol=1e-4, atol=1e-4)
    graphs = graph_calls(step)
    assert graphs, "the kernels were not batched into CPUGraph"
    kernels = [k for g in graphs for k in g.src[0].src[0].src]
    split = [k for k in kernels if "core_id" in k.src[0].arg.runtimevars]
    assert split or executor().threads == 1, "the matmuls should be split across the cores"


def test_symbolic_variables_are_patched_per_call():
    buf = Tensor(np.arange(64, dtype=np.float32)).realize()

    @TinyJit
    def window_sum(pos: UOp) -> Tensor:
        a = buf.shrink(((pos, pos + 8),)).contiguous()  # a kernel whose arguments include the variable
        return (a * 2).sum().reshape(1).contiguous().realize()

    v = UOp.variable("pos", 0, 56)
    for pos in (0, 5, 17, 56, 3):
        assert window_sum(v.bind(pos)).item() == 2 * sum(range(pos, pos + 8))
    assert graph_calls(window_sum)


def test_kernels_with_too_many_arguments_run_outside_the_graph():
    rng = np.random.default_rng(1)
    inputs = [Tensor(rng.standard_normal(8).astype(np.float32)).realize() for _ in range(MAX_ARGS + 2)]

    @TinyJit
    def wide(scale: Tensor) -> Tensor:
        total = inputs[0] * scale
        for t in inputs[1:]:
            total = total + t
        return ((total * 2).contiguous() + 1).contiguous().realize()  # one kernel over all of them, then small ones

    for s in (1.0, 2.0, 3.0):
        want = sum(t.numpy() for t in inputs[1:]) + inputs[0].numpy() * s
        np.testing.assert_allclose(wide(Tensor([s] * 8)).numpy(), want * 2 + 1, rtol=1e-5)
