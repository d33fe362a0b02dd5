"""Chained hashes of full KV blocks: the keys of the prefix cache.

Block i's hash covers its own token ids and block i-1's hash, so equal hashes mean equal prefixes up to
the end of the block (and hence equal keys and values, which depend on every earlier token). The first
block chains from a root that an extra key (a cache salt) can change, so that requests only share
cached blocks with requests that used the same key.
"""
import hashlib
from array import array
from collections.abc import Callable, Sequence

BlockHash = bytes
HashFn = Callable[[BlockHash, Sequence[int]], BlockHash]

_NO_SALT_ROOT: BlockHash = bytes(16)


def root_hash(cache_salt: str | None) -> BlockHash:
    if cache_salt is None:
        return _NO_SALT_ROOT
    return hashlib.blake2b(cache_salt.encode(), digest_size=16, person=b"tinyvllm.salt").digest()


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """128-bit blake2b over the parent hash and the tokens as int64s: deterministic across processes and runs."""
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16).digest()
