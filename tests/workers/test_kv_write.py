"""workers/kv_write.py: a step's keys and values land in exactly their slots, in one kernel per layer."""
import numpy as np
from tinygrad import Tensor, TinyJit

from tinyvllm.workers.kv_write import token_slots, write_kv

BS, MAXB, SLOTS = 4, 6, 40


def test_write_kv_stores_each_row_at_its_slot_and_nothing_else():
    rng = np.random.default_rng(0)
    start = rng.standard_normal((SLOTS, 2, 3, 8)).astype(np.float32)
    cache = Tensor(start.copy()).realize()
    kv = rng.standard_normal((4, 2, 3, 8)).astype(np.float32)
    slots = np.array([5, 17, 39, 2], np.int32)
    write_kv(cache, Tensor(kv), Tensor(slots)).realize()
    expected = start.copy()
    expected[slots] = kv
    np.testing.assert_array_equal(cache.numpy(), expected)


def test_write_kv_in_a_jit_takes_new_slots_each_call():
    cache = Tensor.zeros(SLOTS, 2, 1, 4).contiguous().realize()
    step = TinyJit(lambda kv, slots: write_kv(cache, kv, slots).realize())
    expected = np.zeros((SLOTS, 2, 1, 4), np.float32)
    for call in range(4):
        kv = np.full((2, 2, 1, 4), call + 1, np.float32)
        slots = np.array([call, 10 + 3 * call], np.int32)
        step(Tensor(kv).realize(), Tensor(slots).realize())
        expected[slots] = kv
    np.testing.assert_array_equal(cache.numpy(), expected)


def test_token_slots_follow_each_tokens_table_row_to_its_position():
    """Decodes of rows 0 and 2 and a prompt chunk of row 1, in one flat batch."""
    tables = np.arange(3 * MAXB, dtype=np.int32).reshape(3, MAXB)[:, ::-1].copy()  # distinct, scattered block ids
    rows = np.array([0, 1, 1, 1, 2], np.int32)
    positions = np.array([0, 4, 5, 6, 23], np.int32)  # row 1: block 1; row 2: block 5
    got = token_slots(Tensor(tables), Tensor(rows), Tensor(positions), Tensor(np.array([5], np.int32)), BS, 99).numpy()
    assert got.tolist() == [tables[r, p // BS] * BS + p % BS for r, p in zip(rows, positions)]


def test_token_slots_send_padding_to_the_scratch_slot():
    tables = np.array([[7, 3, 9, 1, 0, 0]], np.int32)
    scratch, positions = 99, np.array([3, 4, 5, 6, 7, 8, 0, 0, 40, 0], np.int32)  # one padding token's position runs past the table
    got = token_slots(Tensor(tables), Tensor(np.zeros(10, np.int32)), Tensor(positions), Tensor(np.array([6], np.int32)),
                      BS, scratch).numpy().tolist()
    assert got == [tables[0, p // BS] * BS + p % BS for p in range(3, 9)] + [scratch] * 4
