"""The persistent prefix cache's files (workers/kv_disk_store.py, workers/kv_disk_file.py): a block saved by one
cache loads bit-exact into another block of a fresh cache; a truncated, corrupt, foreign (another model or rank) or
misnamed file is refused, reported and leaves the block untouched."""
import os

import numpy as np
import pytest
from tinygrad import Tensor

from tests.workers.test_paged_attention import CFG
from tinyvllm.protocol.kv_compat import kv_compat_fields, kv_compat_hash
from tinyvllm.protocol.messages import KVDiskBlock, StepPlan, StepResult
from tinyvllm.workers.kv_block_io import KVBlockIO
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.kv_disk_file import HEADER_BYTES, BlockFileKey
from tinyvllm.workers.kv_disk_store import KVDiskStore

KEY = BlockFileKey(kv_compat_hash(kv_compat_fields("model-a", "float32", 4, CFG.n_layers, CFG.n_kv_heads,
                                                   CFG.head_dim)), rank=0, tp_size=1, pp_size=1)
HASHES = [bytes([i]) * 16 for i in range(4)]


def random_cache(seed: int | None) -> PagedKVCache:
    cache = PagedKVCache(CFG, num_blocks=8, block_size=4)
    for layer in cache.layers:
        values = np.zeros(layer.shape, np.float32) if seed is None else \
            np.random.default_rng(seed).random(layer.shape, dtype=np.float32)
        layer.assign(Tensor(values)).realize()
    return cache


def plan(**fields) -> StepPlan:
    return StepPlan(1, [], [], [], **fields)


@pytest.fixture
def saved(tmp_path):
    """Blocks 1..4 of a random cache saved under HASHES; (their bytes, the folder)."""
    io = KVBlockIO(random_cache(seed=1))
    store = KVDiskStore(str(tmp_path), KEY, io)
    store.save(plan(kv_disk_saves=[KVDiskBlock(i + 1, h) for i, h in enumerate(HASHES)]))
    store.close()
    return [io.read(i + 1) for i in range(4)], store.dir


def load_all(tmp_path, key: BlockFileKey = KEY, group=None) -> tuple[list[bytes], list[int]]:
    """A fresh (zero) cache loads HASHES into blocks 4..7: (those blocks' bytes, the failed block ids)."""
    io = KVBlockIO(random_cache(seed=None))
    store = KVDiskStore(str(tmp_path), key, io, group)
    result = StepResult(1, 0, [], [])
    store.load(plan(kv_disk_loads=[KVDiskBlock(i + 4, h) for i, h in enumerate(HASHES)]), result)
    store.close()
    return [io.read(i + 4) for i in range(4)], result.kv_disk_failed_block_ids


def test_a_saved_block_loads_bit_exact_into_another_cache(tmp_path, saved):
    blocks, folder = saved
    assert sorted(os.listdir(folder)) == sorted(f"{h.hex()}.r0.kv" for h in HASHES)  # no temporary file left
    stale = os.path.join(folder, f"{HASHES[0].hex()}.r0.kv.999.tmp")  # a killed worker's half-written file
    open(stale, "wb").close()
    loaded, failed = load_all(tmp_path)
    assert failed == [] and loaded == blocks
    assert not os.path.exists(stale), "a stale temporary file was not removed at start"


def test_bad_files_are_refused_and_leave_the_block_alone(tmp_path, saved):
    blocks, folder = saved
    paths = [os.path.join(folder, f"{h.hex()}.r0.kv") for h in HASHES]
    with open(paths[0], "r+b") as f:  # truncated
        f.truncate(os.path.getsize(paths[0]) - 100)
    with open(paths[1], "r+b") as f:  # one payload byte flipped
        f.seek(HEADER_BYTES + 10)
        byte = f.read(1)
        f.seek(HEADER_BYTES + 10)
        f.write(bytes([byte[0] ^ 1]))
    with open(paths[3], "rb") as src, open(paths[2], "wb") as dst:  # block 3's file under block 2's name
        dst.write(src.read())
    loaded, failed = load_all(tmp_path)
    assert failed == [4, 5, 6]
    assert loaded[3] == blocks[3] and loaded[0] == loaded[1] == loaded[2] == bytes(len(blocks[0]))


def test_a_file_of_another_model_or_rank_is_refused(tmp_path, saved):
    _, folder = saved
    for other in (BlockFileKey(KEY.compat_hash.replace(KEY.compat_hash[:4], "ffff", 1), 0, 1, 1),
                  BlockFileKey(KEY.compat_hash, 1, 1, 1)):
        other_dir = KVDiskStore(str(tmp_path), other, KVBlockIO(random_cache(None))).dir
        for name in os.listdir(folder):  # another layout's files, copied (or renamed) into its folder
            with open(os.path.join(folder, name), "rb") as src, \
                    open(os.path.join(other_dir, name.replace(".r0.", f".r{other.rank}.")), "wb") as dst:
                dst.write(src.read())
        _, failed = load_all(tmp_path, other)
        assert failed == [4, 5, 6, 7]


class SecondLoadFailedElsewhere:
    """The tensor-parallel group of a rank whose peer could not load the second block."""
    def all_reduce(self, flags):
        return flags + np.array([0, 1, 0, 0], np.float32)


def test_a_block_another_rank_could_not_load_fails_on_every_rank(tmp_path, saved):
    _, failed = load_all(tmp_path, group=SecondLoadFailedElsewhere())
    assert failed == [5]
