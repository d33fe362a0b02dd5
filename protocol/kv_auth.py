"""Who may use a KV side channel: a secret shared by every prefill and decode instance of a deployment
(--kv-secret or $TINYVLLM_KV_SECRET), proved by an HMAC on each message, never sent.

  decode -> prefill:  KVPull{..., nonce, mac=HMAC("kv pull" | request id | block ids | compat hash | rank | nonce |
                      heads | tokens hash)}
  prefill -> decode:  KVBlockData{..., mac=HMAC("kv block" | pull nonce | request id | index | error | SHA-256 of
                      the block's bytes)}  (a real prefill worker, answering this pull, these bytes)
  decode -> prefill:  KVRelease{request id, nonce, mac=HMAC("kv release" | request id | nonce | num_releases)}

A pull also needs a lease: the prefill worker serves only the blocks its scheduler leased under that request id
(workers/kv_side_channel.py) and computed for the same tokens, so a replayed pull reads nothing once the lease is
over. A decode worker pulls from a host beyond loopback only with a secret (else anyone could answer it). Nothing is encrypted (as
protocol/worker_auth.py). Without a secret (side channels on loopback) the same MACs use an empty key.
"""
import hashlib
import hmac

import msgpack

from tinyvllm.protocol.worker_auth import is_loopback, new_nonce, resolve_secret

KV_SECRET_ENV = "TINYVLLM_KV_SECRET"
__all__ = ["KV_SECRET_ENV", "new_nonce", "pull_mac", "block_mac", "release_mac", "same_mac", "resolve_kv_secret",
           "require_kv_secret_beyond_loopback"]


def resolve_kv_secret(flag: str | None, environ) -> str:
    return resolve_secret(flag, environ, KV_SECRET_ENV, "KV secret")


def require_kv_secret_beyond_loopback(secret: str, kv_host: str) -> None:
    if not secret and not is_loopback(f"tcp://{kv_host}:0"):
        raise ValueError(f"--kv-host {kv_host} is reachable from other machines: set a shared secret in "
                         f"{KV_SECRET_ENV} (or --kv-secret), the same for every prefill and decode instance")


def _mac(secret: str, *parts) -> bytes:
    """Over the parts msgpacked as one list: every part keeps its bounds (no two part lists give the same bytes)."""
    return hmac.digest(secret.encode(), msgpack.packb(list(parts), use_bin_type=True), hashlib.sha256)


def pull_mac(secret: str, pull) -> bytes:
    """pull: a KVPull (its mac field aside)."""
    return _mac(secret, b"kv pull", pull.request_id, pull.block_ids, pull.compat_hash, pull.tp_rank, pull.nonce,
                pull.head_start, pull.head_stop, pull.tokens_hash)


def block_mac(secret: str, nonce: bytes, request_id: str, index: int, error: str, data: bytes = b"") -> bytes:
    """Over the block's bytes too: an attacker on the path cannot swap them."""
    return _mac(secret, b"kv block", nonce, request_id, index, error, hashlib.sha256(data).digest())


def release_mac(secret: str, request_id: str, nonce: bytes, num_releases: int = 1) -> bytes:
    return _mac(secret, b"kv release", request_id, nonce, num_releases)


def same_mac(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)
