"""The compatibility hash of a KV side channel: two workers may exchange KV blocks only when the bytes of a block
mean the same on both (vLLM's NixlConnector compatibility_hash). It covers the tinyvllm version, the model's
fingerprint (protocol/compatibility.py), the cache's dtype, block size, layers, the model's KV heads and head dim
(not the tensor-parallel sizes: they may differ)."""
import hashlib
import json


def kv_compat_fields(model_fingerprint: str, dtype: str, block_size: int, n_layers: int, n_kv_heads: int,
                     head_dim: int) -> dict:
    """n_kv_heads: the model's, not one rank's: each decode rank pulls the heads it holds (workers/kv_pull.py)."""
    from tinyvllm.protocol.compatibility import tinyvllm_version
    return {"version": tinyvllm_version(), "model": model_fingerprint, "dtype": dtype, "block_size": block_size,
            "layers": n_layers, "kv_heads": n_kv_heads, "head_dim": head_dim}


def kv_compat_hash(fields: dict) -> str:
    """A short hash of the fields, with the fields themselves after it so that a refusal can say what differs."""
    text = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16] + " " + text


def tokens_hash(token_ids: list[int]) -> str:
    """Names the tokens a remote KV was computed for: a pull for other tokens (another prompt of the same length) is
    refused, so no decode instance caches KV under the wrong tokens."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:32]


def describe_mismatch(mine: str, theirs: str) -> str:
    try:
        a, b = json.loads(mine.split(" ", 1)[1]), json.loads(theirs.split(" ", 1)[1])
        diff = {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}
        what = ", ".join(f"{k}: {x!r} here, {y!r} there" for k, (x, y) in diff.items())
    except (IndexError, ValueError, AttributeError):
        what = "unreadable compatibility fields"
    return f"incompatible KV caches ({what})"
