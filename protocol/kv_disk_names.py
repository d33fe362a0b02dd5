"""Where the persistent prefix cache (--kv-cache-dir) keeps a block: one folder per model, KV dtype, block size and
parallel layout (a worker names it from its KV compatibility hash, protocol/kv_compat.py), and in it one file per block
and worker rank, named by the block's chain hash (protocol/block_hash.py). The scheduler lists the names; the workers
write and read the files (workers/kv_disk_store.py)."""
import re

_FILE_NAME = re.compile(r"([0-9a-f]{32})\.r([0-9]{1,4})\.kv")


def layout_dir_name(compat_hash: str, tp_size: int, pp_size: int) -> str:
    """compat_hash: kv_compat_hash's text (its leading hex digest names the folder)."""
    return f"{compat_hash.split(' ', 1)[0]}-tp{tp_size}-pp{pp_size}"


def block_file_name(block_hash: bytes, rank: int) -> str:
    return f"{block_hash.hex()}.r{rank}.kv"


def parse_block_file_name(name: str) -> tuple[bytes, int] | None:
    """(chain hash, rank) of a block file's name; None for any other name (temporary files included)."""
    match = _FILE_NAME.fullmatch(name)
    return (bytes.fromhex(match[1]), int(match[2])) if match else None
