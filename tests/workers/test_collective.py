"""workers/collective.py's HostGroup between real processes: sums in rank order, bit-identical on every rank,
over many calls of varying shapes (the double buffering); gather; size limits; a missing peer times out; close
leaves nothing behind."""
import glob
import multiprocessing
import os
import tempfile
import uuid

import numpy as np
import pytest

from tinyvllm.workers.collective import HostGroup

SHAPES = [(3,), (16, 8), (1, 576), (7, 5)]
CALLS = 60


def arrays(rank: int, call: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * call + rank)
    return rng.standard_normal(SHAPES[call % len(SHAPES)]).astype(np.float32)


def run_rank(group_id: str, rank: int, size: int, results) -> None:
    group = HostGroup(group_id, rank, size, max_bytes=4 * 576, timeout_s=60)
    sums, gathered = [], []
    for call in range(CALLS):
        sums.append(group.all_reduce(arrays(rank, call)))
        if call % 10 == 0:
            gathered.append(group.gather(arrays(rank, call) * 2, dst=1))
    group.close()
    results.put((rank, [s.tobytes() for s in sums], [g if g is None else [a.tobytes() for a in g] for g in gathered]))


@pytest.mark.parametrize("size", [2, 3])
def test_all_reduce_and_gather_between_processes(size):
    group_id = f"tinyvllm-test-{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=run_rank, args=(group_id, r, size, results)) for r in range(size)]
    for p in procs:
        p.start()
    got = dict((rank, (sums, gathered)) for rank, sums, gathered in (results.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for call in range(CALLS):
        expected = arrays(0, call).copy()
        for r in range(1, size):
            expected += arrays(r, call)  # in rank order
        for rank in range(size):
            assert got[rank][0][call] == expected.tobytes(), f"rank {rank}, call {call}"
    for i, call in enumerate(range(0, CALLS, 10)):
        assert got[1][1][i] == [(arrays(r, call) * 2).tobytes() for r in range(size)]
        assert all(got[r][1][i] is None for r in range(size) if r != 1)
    assert not glob.glob(f"/dev/shm/{group_id}*")
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), f"{group_id}-collective"))


def test_one_rank_needs_nothing_and_limits_hold():
    group = HostGroup("unused", 0, 1, max_bytes=16)
    x = np.ones(100, np.float32)
    assert group.all_reduce(x) is x and group.gather(x)[0] is x
    group.close()
    group_id = f"tinyvllm-test-{uuid.uuid4().hex[:8]}"
    lonely = HostGroup(group_id, 0, 2, max_bytes=64, timeout_s=0.3)
    try:
        with pytest.raises(ValueError, match="over this group's 64"):
            lonely.all_reduce(np.ones(17, np.float32))
        with pytest.raises(TimeoutError, match=r"no answer from rank\(s\) \[1\]"):
            lonely.all_reduce(np.ones(4, np.float32))  # rank 1 never comes: an error, not a hang
    finally:
        lonely.close()
    assert not glob.glob(f"/dev/shm/{group_id}*")
