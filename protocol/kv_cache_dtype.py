"""The KV cache's element types (`--kv-cache-dtype`), named without tinygrad so the frontend can check the flag.

float32, float16 and bfloat16 store the values themselves; int8 and fp8 (e4m3) store codes and one float32 scale
per token per kv head (workers/kv_quant.py). auto: on a CPU float32, the model's activation dtype (on this project's
CPUs no smaller dtype was faster, docs/BENCHMARKS.md); on any other device (a GPU) float16, half the bytes a decode
step reads, as vLLM stores a float16 or bfloat16 model's cache."""

from tinyvllm.protocol.device_kind import is_cpu_device

KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "int8", "fp8")
QUANTIZED_KV_DTYPES = ("int8", "fp8")
ACTIVATION_DTYPE = "float32"
GPU_KV_DTYPE = "float16"


def check_kv_cache_dtype(name: str) -> None:
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown --kv-cache-dtype {name!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")


def resolve_kv_cache_dtype(name: str, device: str) -> str:
    """The dtype a cache asked for as `name` stores on a tinygrad `device` (e.g. CPU, CUDA:1)."""
    check_kv_cache_dtype(name)
    if name != "auto":
        return name
    return ACTIVATION_DTYPE if is_cpu_device(device) else GPU_KV_DTYPE
