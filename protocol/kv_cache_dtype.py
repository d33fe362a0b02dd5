"""The KV cache's element types (`--kv-cache-dtype`), named without tinygrad so the frontend can check the flag.

float32, float16 and bfloat16 store the values themselves; int8 and fp8 (e4m3) store codes and one float32 scale
per token per kv head (workers/kv_quant.py). auto: float32, the model's activation dtype, on every backend (the
model computes in float32; on this project's CPUs no smaller dtype was faster, docs/BENCHMARKS.md)."""

KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "int8", "fp8")
QUANTIZED_KV_DTYPES = ("int8", "fp8")
ACTIVATION_DTYPE = "float32"


def check_kv_cache_dtype(name: str) -> None:
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown --kv-cache-dtype {name!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")


def resolve_kv_cache_dtype(name: str) -> str:
    """The dtype a cache asked for as `name` stores: auto becomes the activation dtype."""
    check_kv_cache_dtype(name)
    return ACTIVATION_DTYPE if name == "auto" else name
