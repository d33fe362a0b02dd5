"""The file of one KV block in the persistent prefix cache (--kv-cache-dir): a fixed header, then the block's bytes
(workers/kv_block_io.py: one block of every layer this rank holds, in the cache's dtype).

The header names what the bytes are, so a file is loaded only where they mean the same: the KV compatibility hash
(model, dtype, block size, layers, KV heads: protocol/kv_compat.py), the rank and the tensor/pipeline-parallel layout
(a rank holds only its heads and layers), the block's chain hash, the payload's length and its blake2b checksum.
Nothing in a file is trusted before all of that matched: a truncated, corrupt or foreign file is refused.
"""
import hashlib
import struct
from dataclasses import dataclass

MAGIC = b"TVLLM-KV"
VERSION = 1
_HEADER = struct.Struct("<8sHHHH16s16sQ16s")  # magic, version, rank, tp, pp, compat, chain hash, length, checksum
HEADER_BYTES = _HEADER.size


class KVDiskFileError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class BlockFileKey:
    """What a file must say it holds to be loaded here."""
    compat_hash: str  # kv_compat_hash's text: its leading hex digest goes in the header
    rank: int
    tp_size: int
    pp_size: int

    @property
    def compat_digest(self) -> bytes:
        digest = bytes.fromhex(self.compat_hash.split(" ", 1)[0])
        return digest.ljust(16, b"\0")[:16]


def _checksum(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


def encode_block_file(key: BlockFileKey, block_hash: bytes, payload: bytes) -> bytes:
    header = _HEADER.pack(MAGIC, VERSION, key.rank, key.tp_size, key.pp_size, key.compat_digest, block_hash,
                          len(payload), _checksum(payload))
    return header + payload


def decode_block_file(data: bytes, key: BlockFileKey, block_hash: bytes, payload_bytes: int) -> bytes:
    """The payload of a block file that holds block_hash's payload_bytes for `key`; else KVDiskFileError."""
    if len(data) < HEADER_BYTES:
        raise KVDiskFileError(f"truncated: {len(data)} bytes, shorter than the header")
    magic, version, rank, tp_size, pp_size, compat, stored_hash, length, checksum = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise KVDiskFileError("not a tinyvllm KV block file of this version")
    if compat != key.compat_digest:
        raise KVDiskFileError("written for another model, KV dtype, block size or layer set")
    if (rank, tp_size, pp_size) != (key.rank, key.tp_size, key.pp_size):
        raise KVDiskFileError(f"written by rank {rank} of tp {tp_size} x pp {pp_size}")
    if stored_hash != block_hash:
        raise KVDiskFileError("holds another block")
    if length != payload_bytes or len(data) != HEADER_BYTES + length:
        raise KVDiskFileError(f"truncated or padded: {len(data) - HEADER_BYTES} payload bytes, expected {payload_bytes}")
    payload = data[HEADER_BYTES:]
    if _checksum(payload) != checksum:
        raise KVDiskFileError("checksum mismatch (corrupt)")
    return payload
