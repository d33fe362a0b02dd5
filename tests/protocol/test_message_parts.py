"""The message bound: nothing over it is handed to ZMQ (its peer would drop it and never answer), and a worker's
StepResult over it goes in parts of its step that merge back into the same result. The bound is lowered in the
tests (codec.MAX_SEND_BYTES), so nothing near 64 MiB is built."""
import asyncio

import pytest
import zmq
import zmq.asyncio

from tinyvllm.protocol import codec
from tinyvllm.protocol import messages as m
from tinyvllm.protocol.codec import MessageTooLarge, decode, encode
from tinyvllm.protocol.message_parts import fitting_ranges, merge_step_results, split_step_result
from tinyvllm.protocol.sampling import MAX_LOGPROB_ENTRIES
from tinyvllm.protocol.transport import make_socket, recv, send, send_async
from tinyvllm.scheduler.request_outputs import well_formed
from tinyvllm.workers.scheduler_connection import send_step_result


def prompt_logprobs(seed: int, length: int) -> list[m.TokenLogprobs]:
    return [m.TokenLogprobs(seed + i, -0.5 * i, [seed, seed + 1], [-0.25, -1.5]) for i in range(length)]


def big_result() -> m.StepResult:
    """Five sampled rows (prompt logprobs on three, sampled logprobs on two) and two embedding rows."""
    lp = m.TokenLogprobs(7, -0.125, [7, 8], [-0.125, -3.0])
    result = m.StepResult(9, 1, ["a", "b", "c", "d", "e"], [11, 12, 13, 14, 15], 0.5,
                          [lp, None, None, lp, None],
                          [prompt_logprobs(100, 20), None, prompt_logprobs(200, 30), prompt_logprobs(300, 5), None],
                          ["x", "y"], [[0.5] * 40, [0.25] * 40])
    result.proposed_draft_ids = [[1, 2], [], [3], [4, 5, 6], []]  # draft-model speculation's proposals, by row
    return result


@pytest.fixture
def sockets():
    ctx = zmq.Context()
    receiver = make_socket(ctx, zmq.PULL, "inproc://bound", bind=True)
    sender = make_socket(ctx, zmq.PUSH, "inproc://bound", bind=False)
    yield sender, receiver
    ctx.destroy(linger=0)


def test_send_refuses_a_message_over_the_bound_and_sends_nothing(sockets, monkeypatch):
    sender, receiver = sockets
    monkeypatch.setattr(codec, "MAX_SEND_BYTES", 100)
    send(sender, m.AbortRequests(["a" * 50]))  # under the bound: goes
    assert recv(receiver) == m.AbortRequests(["a" * 50])
    with pytest.raises(MessageTooLarge) as refused:
        send(sender, m.AbortRequests(["a" * 200]))
    size = len(encode(m.AbortRequests(["a" * 200])))
    assert (refused.value.type_name, refused.value.size, refused.value.limit) == ("AbortRequests", size, 100)
    assert str(refused.value) == f"AbortRequests of {size} bytes is over the 100-byte message bound"
    assert not receiver.poll(0)


def test_send_async_refuses_too(monkeypatch):
    ctx = zmq.asyncio.Context()
    sender = make_socket(ctx, zmq.PUSH, "inproc://bound-async", bind=True)
    monkeypatch.setattr(codec, "MAX_SEND_BYTES", 100)
    try:
        with pytest.raises(MessageTooLarge, match="AbortRequests"):
            asyncio.run(send_async(sender, m.AbortRequests(["a" * 200])))
    finally:
        ctx.destroy(linger=0)


def test_the_configuration_may_lower_the_bound_never_raise_it(monkeypatch):
    monkeypatch.setattr(codec, "MAX_SEND_BYTES", codec.MAX_SEND_BYTES)  # restored after the test
    for value, expected in ((5000, 5000), (2**40, codec.MAX_MESSAGE_BYTES)):
        codec.set_send_bound(value)
        assert codec.MAX_SEND_BYTES == expected


def test_fitting_ranges_halve_until_each_range_fits():
    sizes = [5, 1, 1, 1, 9, 1, 1, 1]
    ranges = fitting_ranges(len(sizes), lambda lo, hi: sum(sizes[lo:hi]) <= 4)
    assert ranges == [(0, 1), (1, 2), (2, 4), (4, 5), (5, 6), (6, 8)]  # in order, covering every row once
    assert fitting_ranges(8, lambda lo, hi: True) == [(0, 8)]
    assert fitting_ranges(0, lambda lo, hi: False) == [(0, 0)]


def test_a_result_under_the_bound_is_one_part():
    result = big_result()
    assert split_step_result(result) == [result]


@pytest.mark.parametrize("bound", [1150, 1500, 2500])
def test_split_parts_fit_and_merge_back(monkeypatch, bound):
    result = big_result()
    assert len(encode(result)) > bound
    monkeypatch.setattr(codec, "MAX_SEND_BYTES", bound)
    parts = split_step_result(result)
    assert len(parts) > 1
    assert all(len(encode(part)) <= bound for part in parts)
    assert [part.more_parts for part in parts] == [True] * (len(parts) - 1) + [False]
    assert all(well_formed(part, 9) and (part.step_id, part.rank) == (9, 1) for part in parts)
    merged = merge_step_results([decode(encode(part)) for part in parts])
    assert merged == result and well_formed(merged, 9)


def test_merging_pads_a_part_without_logprobs():
    lp = m.TokenLogprobs(3, -1.0)
    parts = [m.StepResult(4, 0, ["a", "b"], [1, 2], more_parts=True),
             m.StepResult(4, 0, ["c"], [3], 0.0, [lp], [[lp]], more_parts=True),
             m.StepResult(4, 0, [], [], 0.0, [], [], ["e"], [[1.0]])]
    merged = merge_step_results(parts)
    assert merged == m.StepResult(4, 0, ["a", "b", "c"], [1, 2, 3], 0.0, [None, None, lp], [None, None, [lp]],
                                  ["e"], [[1.0]])
    assert well_formed(merged, 4)


def test_a_row_too_large_alone_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(codec, "MAX_SEND_BYTES", 1000)  # row a fits, row c does not
    with pytest.raises(MessageTooLarge, match="request 'c' alone is too large for a message of step 9"):
        split_step_result(big_result())


def test_the_worker_sends_parts_only_when_needed(sockets, monkeypatch):
    sender, receiver = sockets
    send_step_result(sender, big_result())
    assert recv(receiver) == big_result() and not receiver.poll(0)
    monkeypatch.setattr(codec, "MAX_SEND_BYTES", 1200)
    send_step_result(sender, big_result())
    parts = [recv(receiver)]
    while parts[-1].more_parts:
        parts.append(recv(receiver))
    assert len(parts) > 1 and merge_step_results(parts) == big_result() and not receiver.poll(0)


@pytest.mark.parametrize("top", [0, 1, 20])
def test_the_most_logprobs_one_request_may_ask_for_fit_in_a_message(top):
    """MAX_LOGPROB_ENTRIES (the frontend's limit) at the most bytes an entry can take: the largest token ids."""
    positions = 1000
    big_id = 2**31 - 1
    entries = [m.TokenLogprobs(big_id, -1.5e-7, [big_id] * top, [-2.5e-7] * top) for _ in range(positions)]
    size = len(encode(m.StepResult(1, 0, ["r"], [big_id], 0.0, [], [entries])))
    assert size / (positions * (top + 1)) * MAX_LOGPROB_ENTRIES < codec.MAX_MESSAGE_BYTES / 3
