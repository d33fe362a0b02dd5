"""workers/kernel_set.py: the kernel set is a checked name (or protocol/kernel_choice.py's KernelChoice) the model is
built with, resolved for the device once; only configure_device changes
the device (the "c" set: the reassociating renderer and the C graph executor; "tinygrad": tinygrad's defaults),
never an import or a model's constructor; and each set's model computes the same logits."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tinygrad import Device, Tensor
from tinygrad.engine.realize import to_program_cache
from tinygrad.uop.ops import Ops

import tinyvllm.workers.model as model_module
from tests.workers.dense_reference import random_llama
from tinyvllm.protocol.model_config import ModelConfig
from tinyvllm.workers.cpu_graph import CPUGraph
from tinyvllm.workers.cpu_matmul import REASSOCIATE_PRAGMA, ReassociatingClangRenderer, cpu_linear
import tinyvllm.protocol.kernel_choice as kernel_choice_module
from tinyvllm.protocol.kernel_choice import KERNEL_SETS, KernelChoice
from tinyvllm.workers.kernel_set import check_kernel_set, configure_device, default_kernel_set, kernel_choice
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.quantized_weight import DeviceWeight

CFG = ModelConfig(arch="llama", vocab_size=89, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=48,
                  rope_theta=10000.0, rms_eps=1e-5, max_context=64, tie_embeddings=False)


def test_names_defaults_and_refusals():
    # named in protocol/, without tinygrad
    assert KERNEL_SETS is kernel_choice_module.KERNEL_SETS == ("c", "c-int8", "tinygrad")
    assert default_kernel_set(Device.DEFAULT) == "c-int8", "the test suite runs on tinygrad's CPU backend"
    assert default_kernel_set("NULL") == default_kernel_set("CUDA") == "tinygrad"
    check_kernel_set("NULL", "tinygrad")
    with pytest.raises(ValueError, match="DEV=CPU"):
        check_kernel_set("NULL", "c")
    with pytest.raises(ValueError, match="unknown kernel set"):
        check_kernel_set("CPU", "clang")
    with pytest.raises(ValueError, match="unknown kernel set"):
        Transformer(CFG, random_llama(CFG), 8, kernels="clang")
    with pytest.raises(ValueError, match="DEV=CPU"):
        kernel_choice("NULL", KernelChoice.named("c-int8"))


def test_the_choice_is_resolved_for_the_device():
    """A name or a KernelChoice becomes one KernelChoice; the GPU matvecs only where the device has local memory, the
    tensor-core products only where it has half tensor cores (tests/workers/test_gpu_gemm.py: an emulated GPU's)."""
    assert kernel_choice(Device.DEFAULT) == KernelChoice.named("c-int8")
    assert kernel_choice(Device.DEFAULT, "c") == KernelChoice.named("c")
    tinygrad_here = kernel_choice(Device.DEFAULT, "tinygrad")  # the CPU has no local memory
    assert tinygrad_here.matmul == "tinygrad" and not tinygrad_here.gpu_matvec and not tinygrad_here.tensor_cores
    on_python = kernel_choice("PYTHON", "tinygrad")  # PYTHON emulates local memory; tensor cores only as a GPU's target
    assert on_python.gpu_matvec and not on_python.tensor_cores and KernelChoice.named("tinygrad").tensor_cores
    model = Transformer(CFG, random_llama(CFG), 8, kernels=KernelChoice.named("tinygrad"))
    assert model.kernels == tinygrad_here


def test_configure_device_sets_up_each_set(kernel_set):
    configure_device(Device.DEFAULT, kernel_set)  # a second time: changes nothing more
    dev = Device[Device.DEFAULT]
    if kernel_set == "c":
        assert isinstance(dev.renderer, ReassociatingClangRenderer) and dev.graph is CPUGraph
        assert dev.renderers.count(ReassociatingClangRenderer) == 1
    else:
        assert ReassociatingClangRenderer not in dev.renderers and dev.graph is None


def test_the_c_int8_set_sets_the_device_up_as_the_c_set():
    dev = Device[Device.DEFAULT]
    renderers, graph = dev.renderers, dev.graph
    try:
        configure_device(Device.DEFAULT, "tinygrad")
        configure_device(Device.DEFAULT, "c-int8")
        assert isinstance(dev.renderer, ReassociatingClangRenderer) and dev.graph is CPUGraph
    finally:
        dev.renderers, dev.graph = renderers, graph


def test_the_c_set_renders_tinygrads_kernels_with_the_reassociation_pragma(c_kernel_set):
    # two new kernels in one realize: tinygrad compiles them in its spawned worker pool where it has one
    odd_k, n = 40, 48  # rows of whole 32-blocks take the C kernels; this one takes tinygrad's float32 kernel
    h, w = Tensor(np.ones((5, odd_k), np.float32)).realize(), DeviceWeight.from_host(np.ones((n, odd_k), np.float32))
    before = set(to_program_cache)
    Tensor.realize(cpu_linear(h, w), (h * 7).sum(1))
    sources = {p.src[0].arg.name: p.src[2].arg for key, p in to_program_cache.items()
               if key not in before and p.src[0].arg is not None and p.src[2].op is Ops.SOURCE}
    assert "matmul_f32_5_48" in sources and len(sources) >= 2
    assert all(src.startswith(REASSOCIATE_PRAGMA) for src in sources.values())


def test_importing_and_building_a_model_leave_the_device_alone():
    code = """
from tinygrad import Device
dev = Device["CPU"]
before = (list(dev.renderers), dev.graph)
import tinyvllm.workers.kernel_set, tinyvllm.workers.main
from tinyvllm.workers.model import Transformer
from tests.workers.dense_reference import random_llama
from tests.workers.test_kernel_set import CFG
for kernels in (None, "c", "tinygrad"):
    Transformer(CFG, random_llama(CFG), 16, kernels=kernels)
assert (list(dev.renderers), dev.graph) == before, ((list(dev.renderers), dev.graph), before)
"""
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, "DEV": "CPU"}, check=True, timeout=300)


def test_the_kernel_set_reaches_the_model(kernel_set, monkeypatch):
    c_products = []
    monkeypatch.setattr(model_module, "cpu_linear", lambda h, w, *a: c_products.append(w) or cpu_linear(h, w, *a))
    weights = random_llama(CFG)
    model = Transformer(CFG, weights, 16, kernels=kernel_set)
    assert model.kernels.name == kernel_set and (model.kernels.matmul == "c") == (kernel_set == "c")
    hidden = np.random.default_rng(3).standard_normal((3, CFG.dim)).astype(np.float32)
    got = model.logits(Tensor(hidden)).numpy()
    assert bool(c_products) == (kernel_set == "c")
    want = hidden.astype(np.float64) @ weights["token_embd.weight"].T.astype(np.float64)  # tied output
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
