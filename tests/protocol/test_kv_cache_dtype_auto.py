"""--kv-cache-dtype auto (protocol/kv_cache_dtype.py): float16 on a GPU; on a CPU float16 under the lossy default
kernel set (c-int8) and float32 under the exact ones; an explicit dtype is itself everywhere; a misspelt one is
refused by name."""
import pytest

from tinyvllm.protocol.kv_cache_dtype import resolve_kv_cache_dtype


@pytest.mark.parametrize("device,kernels,want", [
    ("CPU", "c-int8", "float16"), ("CPU", "c", "float32"), ("CPU", "tinygrad", "float32"),
    ("PYTHON", "tinygrad", "float32"), ("CUDA", "tinygrad", "float16"), ("CUDA:1", "tinygrad", "float16"),
    ("NV", "tinygrad", "float16"), ("AMD", "tinygrad", "float16"), ("METAL", "tinygrad", "float16")])
def test_auto_follows_the_device_and_the_kernel_sets_exactness(device, kernels, want):
    assert resolve_kv_cache_dtype("auto", device, kernels) == want
    for explicit in ("float32", "bfloat16", "fp8"):
        assert resolve_kv_cache_dtype(explicit, device, kernels) == explicit


def test_a_misspelt_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"unknown --kv-cache-dtype 'fp16': choose one of auto, float32, float16"):
        resolve_kv_cache_dtype("fp16", "CUDA", "tinygrad")
