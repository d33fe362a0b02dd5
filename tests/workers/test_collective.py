"""workers/collective.py's HostGroup. Ranks run as programs of their own, as the launcher starts workers (this file
run as a script), attaching ranks started first: many all_reduce calls of varying shapes (the double buffering,
with a different slow rank now and then) equal numpy's sum in rank order, bit-identical on every rank; gather; an
array over max_bytes is refused and leaves the group in step; nothing is left in /dev/shm or the temporary folder
(FIFOs), and nothing on stderr (no resource-tracker warning). A peer that never calls is a TimeoutError, one that
is gone a ConnectionError: never a hang."""
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np
import pytest

from tinyvllm.workers.collective import HostGroup

SHAPES = [(3,), (16, 8), (1, 576), (7, 5), (576,)]  # (1, 576) float32 is exactly MAX_BYTES
MAX_BYTES = 4 * 576
CALLS = 60
WAIT_S = 120  # generous wherever waiting is not the point: a loaded 2-core machine


def array(rank: int, call: int) -> np.ndarray:
    x = np.random.default_rng([call, rank]).standard_normal(SHAPES[call % len(SHAPES)]).astype(np.float32)
    return x.T if call % 5 == 1 else x  # now and then a non-contiguous view


def rank_order_sum(size: int, call: int) -> np.ndarray:
    total = array(0, call) + array(1, call)
    for rank in range(2, size):
        total += array(rank, call)
    return total


def run_rank(group_id: str, rank: int, size: int) -> None:
    """One rank's program: checks every result itself, prints a digest of all its sums."""
    group = HostGroup(group_id, rank, size, MAX_BYTES, timeout_s=WAIT_S)
    digest = hashlib.sha256()
    for call in range(CALLS):
        if call % 3 == 0 and call % size == rank:
            time.sleep(0.002)  # this rank is late; the others finish the call before it and run ahead
        total = group.all_reduce(array(rank, call))
        expected = rank_order_sum(size, call)
        assert (total.shape, total.dtype, total.tobytes()) == (expected.shape, np.float32, expected.tobytes()), call
        digest.update(total.tobytes())
        if call % 10 == 0:
            got = group.gather(array(rank, call) * 2, dst=size - 1)
            if rank == size - 1:
                assert [g.tobytes() for g in got] == [(array(r, call) * 2).tobytes() for r in range(size)]
            else:
                assert got is None
        if call == 30:
            with pytest.raises(ValueError, match="over this group's max_bytes of 2304"):
                group.all_reduce(np.zeros(577, np.float32))
    assert group.busy_s > 0
    group.close()
    group.close()
    print(digest.hexdigest())


def run_idle_peer(group_id: str) -> None:
    """Rank 1 attached and listening but never calling: rank 0 gets a TimeoutError in time; once rank 1 has closed
    (as if it had exited), a ConnectionError at once. Both ranks live in this one process, so they share a resource
    tracker (as multiprocessing children do)."""
    lonely, idle = HostGroup(group_id, 0, 2, 64, timeout_s=0.5), HostGroup(group_id, 1, 2, 64, timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank 0: no answer from rank\(s\) \[1\] within 0.5 s"):
        lonely.all_reduce(np.ones(4, np.float32))
    assert 0.5 <= time.monotonic() - start < 10
    idle.close()
    with pytest.raises(ConnectionError):
        lonely.all_reduce(np.ones(4, np.float32))
    lonely.close()


def run_programs(group_id: str, *argvs: list[str]) -> list[str]:
    """Runs this file as each program; every one must exit 0 with nothing on stderr. Their outputs."""
    procs = [subprocess.Popen([sys.executable, __file__, group_id, *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for argv in argvs]
    try:
        results = [p.communicate(timeout=WAIT_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for argv, p, (_, err) in zip(argvs, procs, results):
        assert p.returncode == 0 and not err, f"{argv}: exit code {p.returncode}\n{err}"
    assert not glob.glob(f"/dev/shm/*{group_id}*")
    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"*{group_id}*"))
    return [out for out, _ in results]


@pytest.mark.parametrize("size", [2, 3])
def test_ranks_in_their_own_processes(size):
    outputs = run_programs(f"test-{uuid.uuid4().hex}", *([str(r), str(size)] for r in reversed(range(size))))
    assert len(set(outputs)) == 1 and outputs[0].strip()  # bit-identical sums on every rank


def test_a_peer_that_never_calls_is_a_timeout_one_gone_a_connection_error():
    run_programs(f"test-{uuid.uuid4().hex}", ["idle"])


def test_one_rank_needs_nothing_and_a_missing_rank_zero_times_out():
    group = HostGroup("unused", 0, 1, max_bytes=16)
    x = np.ones(100, np.float32)
    assert group.all_reduce(x) is x and group.gather(x)[0] is x and group.shm is None
    group.close()
    with pytest.raises(TimeoutError, match="rank 1: no shared memory from rank 0 within 0.1 s"):
        HostGroup(f"test-{uuid.uuid4().hex}", 1, 2, max_bytes=16, timeout_s=0.1)
    with pytest.raises(ValueError):
        HostGroup("unused", 2, 2, max_bytes=16)


if __name__ == "__main__":
    if sys.argv[2] == "idle":
        run_idle_peer(sys.argv[1])
    else:
        run_rank(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
