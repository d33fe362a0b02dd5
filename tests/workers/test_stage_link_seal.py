"""workers/stage_link.py with a worker secret: a stage takes only what its previous stage sealed, in order; an
unsealed message, one sealed with another key and a replayed one are dropped (and logged), never taken as input."""
import logging

import msgpack
import numpy as np
import zmq

from tinyvllm.protocol.worker_auth import stage_link_key
from tinyvllm.workers.stage_link import StageLink

SECRET = "stage-link-secret-0123456789"


def test_only_sealed_input_in_sequence(tmp_path, caplog):
    ctx = zmq.Context()
    try:
        key, other = stage_link_key(SECRET, "group", 1), stage_link_key(SECRET, "other group", 1)
        receiver = StageLink(ctx, f"ipc://{tmp_path}/stage-1", timeout_s=10)
        sender = StageLink(ctx, None, timeout_s=10)
        receiver.seal(key, stage_link_key(SECRET, "group", 2))
        sender.seal(stage_link_key(SECRET, "group", 0), key)
        sender.connect_next(receiver.address)
        forger = sender.outbox  # the same connection, so the forgeries arrive in order between the real messages

        first, second = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((1, 3), np.float32)
        header = msgpack.packb({"shape": [2, 3], "dtype": "float32"})
        sender.send(first)
        assert np.array_equal(receiver.recv(), first)
        forger.send_multipart([header, first.tobytes()])  # unsealed
        forger.send_multipart([header, first.tobytes(), sender._seal(other, 1, header, first)])  # another key
        forger.send_multipart([header, first.tobytes(), sender._seal(key, 0, header, first)])  # a replay of #0
        sender.send(second)
        with caplog.at_level(logging.WARNING, "tinyvllm.worker"):
            assert np.array_equal(receiver.recv(), second)
        assert caplog.text.count("did not seal") == 3 and receiver.received == 2
    finally:
        ctx.destroy(linger=0)


def test_hidden_states_over_the_message_bound_fail_the_send_instead_of_vanishing(tmp_path, monkeypatch):
    import pytest

    from tinyvllm.protocol.codec import MessageTooLarge
    from tinyvllm.workers import stage_link
    monkeypatch.setattr(stage_link, "MAX_MESSAGE_BYTES", 64)  # the receiver's MAXMSGSIZE is the same bound
    ctx = zmq.Context()
    try:
        receiver = StageLink(ctx, f"ipc://{tmp_path}/stage-1", timeout_s=10)
        sender = StageLink(ctx, None, timeout_s=10)
        sender.connect_next(receiver.address)
        sender.send(np.ones((4, 4), np.float32))  # 64 bytes: fits
        assert receiver.recv().shape == (4, 4)
        with pytest.raises(MessageTooLarge, match="max-num-batched-tokens"):
            sender.send(np.ones((5, 4), np.float32))
    finally:
        ctx.destroy(linger=0)
