"""protocol/kernel_choice.py: each kernel set's name stands for one KernelChoice, plain data that every process can
import without tinygrad."""
import dataclasses
import subprocess
import sys

import pytest

from tinyvllm.protocol.kernel_choice import C_KERNEL_SETS, KERNEL_SETS, KernelChoice, MatvecLayout

EXPECTED = {  # name: (matmul, attention, int8 activations, GPU matvecs)
    "c": ("c", "c", False, False),
    "c-int8": ("c", "c", True, False),
    "tinygrad": ("tinygrad", "tinygrad", False, True),
}


@pytest.mark.parametrize("name", KERNEL_SETS)
def test_named_describes_the_set(name):
    choice = KernelChoice.named(name)
    assert choice.name == name
    assert (choice.matmul, choice.attention, choice.int8_activations, choice.gpu_matvec) == EXPECTED[name]
    assert choice.c_kernels == (name in C_KERNEL_SETS)
    assert choice.matvec_layout == MatvecLayout(threads=32, rows=4, local=4)
    assert KernelChoice.named(name) == choice and hash(KernelChoice.named(name)) == hash(choice)


def test_an_unknown_name_is_refused_and_a_choice_is_frozen():
    with pytest.raises(ValueError, match="unknown kernel set 'clang': choose one of c, c-int8, tinygrad"):
        KernelChoice.named("clang")
    with pytest.raises(dataclasses.FrozenInstanceError):
        KernelChoice.named("c").int8_activations = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        MatvecLayout().threads = 8
    tuned = dataclasses.replace(KernelChoice.named("tinygrad"), matvec_layout=MatvecLayout(16, 2, 4))
    assert tuned.matvec_layout.threads == 16 and tuned != KernelChoice.named("tinygrad")


def test_importing_it_loads_no_tinygrad():
    code = "import sys, tinyvllm.protocol.kernel_choice; print(any(m.split('.')[0] == 'tinygrad' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
