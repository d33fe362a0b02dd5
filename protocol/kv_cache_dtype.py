"""The KV cache's element types (`--kv-cache-dtype`), named without tinygrad so the frontend can check the flag.

float32, float16 and bfloat16 store the values themselves; int8 and fp8 (e4m3) store codes and one float32 scale
per token per kv head (workers/kv_quant.py). auto: on any device but a CPU (a GPU) float16, half the bytes a decode
step reads, as vLLM stores a float16 or bfloat16 model's cache; on a CPU float16 under the lossy default kernel set
("c-int8": its int8 activations round far more than a half's 11-bit mantissa does, and the C attention widens halves
at no measurable cost, docs/BENCHMARKS.md), float32 (the model's activation dtype) under the exact ones ("c",
"tinygrad"), whose logprobs match Hugging Face's float32 within 1e-4."""

from tinyvllm.protocol.device_kind import is_cpu_device
from tinyvllm.protocol.kernel_choice import KernelChoice

KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "int8", "fp8")
QUANTIZED_KV_DTYPES = ("int8", "fp8")
ACTIVATION_DTYPE = "float32"
GPU_KV_DTYPE = "float16"
INT8_ACTIVATIONS_KV_DTYPE = "float16"


def check_kv_cache_dtype(name: str) -> None:
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown --kv-cache-dtype {name!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")


def resolve_kv_cache_dtype(name: str, device: str, kernels: str) -> str:
    """The dtype a cache asked for as `name` stores on a tinygrad `device` (e.g. CPU, CUDA:1) whose model runs the
    kernel set `kernels`."""
    check_kv_cache_dtype(name)
    if name != "auto":
        return name
    if not is_cpu_device(device):
        return GPU_KV_DTYPE
    return INT8_ACTIVATIONS_KV_DTYPE if KernelChoice.named(kernels).int8_activations else ACTIVATION_DTYPE
