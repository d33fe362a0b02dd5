"""The start-up handshake between the scheduler's WorkerGroup and workers (workers/scheduler_join.py) over real ZMQ
sockets, with hand-made hellos and no model: who is admitted, who is refused and why (both sides say so), that
after the handshake only the admitted identities are heard, and that a worker notices when the scheduler is gone."""
import dataclasses
import logging
import threading
import time

import pytest
import zmq

from tests.e2e.server_process import wait_until
from tinyvllm.protocol.codec import decode
from tinyvllm.protocol.compatibility import tinyvllm_version
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.messages import Shutdown, WorkerError, WorkerHello, WorkerProof, WorkerReady, WorkerRefused
from tinyvllm.protocol.process_args import SchedulerArgs
from tinyvllm.protocol.transport import make_socket, send
from tinyvllm.protocol.worker_auth import new_nonce
from tinyvllm.scheduler.worker_group import WorkerGroup
from tinyvllm.workers.scheduler_connection import SchedulerWatch
from tinyvllm.workers.scheduler_join import NoScheduler, WorkerRefusedError, join_scheduler

SECRET = "handshake-test-secret-0123"
FINGERPRINT = "llama 4 layers #0123"
ARGS = SchedulerArgs(EngineConfig.of(pipeline_parallel_size=2, block_size=16, max_num_seqs=4, max_num_batched_tokens=32,
                                     num_kv_blocks=64, max_model_len=256), n_layers=4, model_fingerprint=FINGERPRINT,
                     startup_timeout_s=30)


def hello(rank: int, **change) -> WorkerHello:
    return dataclasses.replace(WorkerHello(rank, 2, "both", 1000 + rank, "CPU", 1, 2,
                                           f"tcp://127.0.0.1:{7100 + rank}" if rank else "", tinyvllm_version(),
                                           FINGERPRINT, [0, 2] if rank == 0 else [2, 4], new_nonce()), **change)


@pytest.fixture
def engine(tmp_path):
    """(a function making a DEALER connected to the scheduler's worker socket, the scheduler's WorkerGroup)."""
    ctx = zmq.Context()
    address = f"ipc://{tmp_path}/workers"
    group = WorkerGroup(make_socket(ctx, zmq.ROUTER, address, bind=True), secret=SECRET)
    yield lambda: make_socket(ctx, zmq.DEALER, address, bind=False), group
    ctx.destroy(linger=0)


def in_thread(fn, *args):
    """Starts fn(*args) in a thread; returns a function that waits for it and gives its result or raises its error."""
    result = {}

    def run():
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # raised again in the caller's thread
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join():
        thread.join(30)
        assert not thread.is_alive()
        if "error" in result:
            raise result["error"]
        return result["value"]
    return join


def refusal(sock: zmq.Socket, msg_hello: WorkerHello, secret: str = SECRET) -> str:
    with pytest.raises(WorkerRefusedError) as e:
        join_scheduler(sock, msg_hello, secret, 10)
    return str(e.value)


def test_strangers_are_refused_and_the_right_workers_join(engine, caplog):
    dealer, group = engine
    caplog.set_level(logging.INFO, "tinyvllm.scheduler")
    handshake = in_thread(group.handshake, ARGS)

    assert "could not prove it knows the worker secret" in refusal(dealer(), hello(0), "another-secret-of-length")
    assert wait_until(lambda: "refused worker rank 0 (CPU, pid 1000) at ipc: it does not know the worker secret"
                      in caplog.text, 10)  # the worker does not wait for the refusal: it knows already
    assert "refused by the scheduler: tinyvllm 0.0.1 on the worker" in refusal(dealer(), hello(0, version="0.0.1"))
    assert "it would hold layers [0, 4]" in refusal(dealer(), hello(1, layers=[0, 4]))
    garbage = dealer()
    garbage.send(b"\xc1")
    assert "an undecodable message" in decode(garbage.recv()).reason
    early = dealer()
    send(early, WorkerProof(b"x" * 32))
    assert decode(early.recv()) == WorkerRefused("WorkerProof before a hello and its proof")

    first = dealer()
    joined0 = in_thread(join_scheduler, first, hello(0, pid=4242), SECRET, 10)
    assert wait_until(lambda: "worker rank 0 (CPU, pid 4242) at ipc joined (1 of 2 workers)" in caplog.text, 10)
    restarted = dealer()  # the same rank again (a restarted worker): the newest one keeps it, the earlier is told
    joined0_again = in_thread(join_scheduler, restarted, hello(0, pid=4343), SECRET, 10)
    with pytest.raises(WorkerRefusedError, match="another worker joined as rank 0"):
        joined0()
    joined0, first = joined0_again, restarted
    second = dealer()
    joined1 = in_thread(join_scheduler, second, hello(1), SECRET, 10)
    init0, init1 = joined0(), joined1()
    assert (init0.next_stage_address, init1.next_stage_address) == ("tcp://127.0.0.1:7101", "")
    assert init0.group_id == init1.group_id
    assert init0.engine.cache.num_kv_blocks == 64 and init0.engine.model.max_model_len == 256
    assert init0.engine == init1.engine == ARGS.engine
    for sock, rank in ((first, 0), (second, 1)):
        send(sock, WorkerReady(rank, 40 + rank, 16, 256))
    assert handshake() == 40  # the smallest pool

    stranger = dealer()  # after the handshake: a stranger is not even decoded; an admitted worker is heard
    send(stranger, WorkerError(0, "forged"))
    stranger.send(b"\xc1")
    assert [group.recv(time.monotonic() + 10)[1] for _ in range(2)] == [None, None]
    send(second, WorkerError(1, "real"))
    assert group.recv(time.monotonic() + 10)[1] == WorkerError(1, "real")

    watch = SchedulerWatch(second)  # the scheduler goes: what it sent first is read, then the worker knows
    send(group.sock, Shutdown("bye"), group.identities[1])
    group.sock.close(linger=1000)
    assert watch.recv() == Shutdown("bye")
    with pytest.raises(NoScheduler, match="the connection to the scheduler dropped"):
        watch.recv()


def test_a_worker_address_beyond_loopback_needs_a_secret():
    ctx = zmq.Context()
    try:
        sock = make_socket(ctx, zmq.ROUTER, "tcp://0.0.0.0:*", bind=True)
        with pytest.raises(ValueError, match="reachable from other machines"):
            WorkerGroup(sock, secret="")
        WorkerGroup(sock, secret=SECRET)
    finally:
        ctx.destroy(linger=0)


def test_hellos_that_never_prove_anything_do_not_lock_the_workers_out(engine, monkeypatch, caplog):
    monkeypatch.setattr("tinyvllm.scheduler.worker_admission.MAX_PENDING", 4)
    dealer, group = engine
    caplog.set_level(logging.INFO, "tinyvllm.scheduler")
    handshake = in_thread(group.handshake, ARGS)
    for rank in range(6):  # more unfinished handshakes than the scheduler keeps: the oldest ones are dropped
        silent = dealer()
        send(silent, hello(rank % 2, pid=5000 + rank))
        silent.recv()  # its challenge, never answered
    assert "dropped the unfinished handshake of worker rank 0 (CPU, pid 5000)" in caplog.text
    workers = [dealer(), dealer()]
    joined = [in_thread(join_scheduler, sock, hello(rank), SECRET, 10) for rank, sock in enumerate(workers)]
    assert [j().group_id for j in joined][0]
    for rank, sock in enumerate(workers):
        send(sock, WorkerReady(rank, 40, 16, 256))
    assert handshake() == 40


def test_a_start_that_fails_tells_the_workers_that_joined(engine):
    """One rank joined, the other never comes: at the scheduler's time limit the joined worker is told and stops
    waiting (NoScheduler: exit 1, a service manager starts it again for the next scheduler)."""
    dealer, group = engine
    handshake = in_thread(group.handshake, dataclasses.replace(ARGS, startup_timeout_s=2))
    joined = in_thread(join_scheduler, dealer(), hello(0), SECRET, 10)
    with pytest.raises(TimeoutError):
        handshake()
    with pytest.raises(NoScheduler, match="the scheduler stopped before the engine started: the engine did not start"):
        joined()


def test_a_worker_waiting_for_the_others_notices_a_scheduler_that_died(engine, monkeypatch, caplog):
    dealer, group = engine
    caplog.set_level(logging.INFO, "tinyvllm.scheduler")
    handshake = in_thread(group.handshake, dataclasses.replace(ARGS, startup_timeout_s=3))
    sock = dealer()
    joined = in_thread(join_scheduler, sock, hello(0), SECRET, 10, SchedulerWatch(sock).recv)
    assert wait_until(lambda: "joined (1 of 2 workers)" in caplog.text, 10)
    # a scheduler that dies says nothing: only the connection drops
    monkeypatch.setattr("tinyvllm.scheduler.worker_admission.WorkerAdmission.send", lambda *args: None)
    with pytest.raises(TimeoutError):  # rank 1 never came
        handshake()
    group.sock.close(linger=0)
    with pytest.raises(NoScheduler, match="the connection to the scheduler dropped"):
        joined()


def test_workers_whose_caches_would_store_different_dtypes_are_refused(engine):
    """--kv-cache-dtype auto under different --kernels (float16 under c-int8, float32 under c): one engine's ranks
    must store one dtype, so the start fails naming each rank's."""
    dealer, group = engine
    handshake = in_thread(group.handshake, ARGS)
    workers = [dealer(), dealer()]
    joined = [in_thread(join_scheduler, sock, hello(rank), SECRET, 10) for rank, sock in enumerate(workers)]
    assert [j().group_id for j in joined][0]
    for rank, sock in enumerate(workers):
        send(sock, WorkerReady(rank, 40, 16, 256, kv_cache_dtype=("float16", "float32")[rank]))
    with pytest.raises(RuntimeError, match="different dtypes \\(rank 0 float16, rank 1 float32\\)"):
        handshake()
