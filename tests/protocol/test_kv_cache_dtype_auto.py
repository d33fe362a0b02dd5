"""--kv-cache-dtype auto (protocol/kv_cache_dtype.py): float32 on a CPU, float16 on a GPU; an explicit dtype is
itself everywhere; a misspelt one is refused by name."""
import pytest

from tinyvllm.protocol.kv_cache_dtype import resolve_kv_cache_dtype


@pytest.mark.parametrize("device,want", [("CPU", "float32"), ("PYTHON", "float32"), ("CUDA", "float16"),
                                         ("CUDA:1", "float16"), ("NV", "float16"), ("AMD", "float16"),
                                         ("METAL", "float16")])
def test_auto_is_float32_on_a_cpu_and_float16_on_a_gpu(device, want):
    assert resolve_kv_cache_dtype("auto", device) == want
    assert resolve_kv_cache_dtype("bfloat16", device) == "bfloat16" and resolve_kv_cache_dtype("fp8", device) == "fp8"


def test_a_misspelt_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"unknown --kv-cache-dtype 'fp16': choose one of auto, float32, float16"):
        resolve_kv_cache_dtype("fp16", "CUDA")
