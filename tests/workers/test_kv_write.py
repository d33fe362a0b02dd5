"""workers/kv_write.py: a step's keys and values land in exactly their slots, in one kernel per layer."""
import numpy as np
from tinygrad import Tensor, TinyJit

from tinyvllm.workers.kv_write import decode_slots, prefill_slots, write_kv

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


def test_decode_slots_follow_each_rows_table_to_its_last_position():
    tables = np.arange(3 * MAXB, dtype=np.int32).reshape(3, MAXB)[:, ::-1].copy()  # distinct, scattered block ids
    lens = np.array([1, 6, 24], np.int32)  # last positions 0, 5 (block 1), 23 (block 5)
    got = decode_slots(Tensor(tables), Tensor(lens), BS).numpy()
    want = [tables[b, (n - 1) // BS] * BS + (n - 1) % BS for b, n in enumerate(lens)]
    assert got.tolist() == want


def test_prefill_slots_send_padding_to_the_scratch_slot():
    table = np.array([7, 3, 9, 1, 0, 0], np.int32)
    scratch = 99
    got = prefill_slots(Tensor(table), Tensor(np.array([3], np.int32)), Tensor(np.array([6], np.int32)), 16, BS,
                        scratch).numpy().tolist()
    real = [table[p // BS] * BS + p % BS for p in range(3, 9)]
    assert got == real + [scratch] * 10  # positions 9.. are padding, some past the table's end
