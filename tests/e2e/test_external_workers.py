"""`tinyvllm serve --external-workers` with two `tinyvllm worker`s (pipeline-parallel, tcp on loopback, a shared
secret): a worker with another secret and one with another model are refused (a scheduler log line naming the peer
and why, exit code 3) and the server keeps waiting; the right ones join and the server answers. Afterwards a stranger
on the worker socket and one pushing at a stage's input are ignored, and stopping the server stops the workers."""
import re

import httpx
import msgpack
import zmq

from tests.e2e.server_process import READY_LINE, REQUEST_TIMEOUT_S, ServerProcess, free_port, wait_until
from tests.e2e.worker_process import WorkerProcess
from tests.helpers.tiny_model import make_tiny_gguf
from tinyvllm.protocol.codec import encode
from tinyvllm.protocol.messages import WorkerError

SECRET = "e2e-worker-secret-0123456789"
REFUSED = 3


def complete(url: str) -> str:
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 4},
                   timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def assert_logged(server: ServerProcess, pattern: str, timeout_s: float = 30) -> None:
    assert wait_until(lambda: re.search(pattern, server.log()), timeout_s), \
        f"{pattern!r} is not in the server's log" + server.log_tail()


def test_external_workers_join_strangers_are_refused(tiny_model, tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    server = ServerProcess(tiny_model, tmp_path / "server.log", "--external-workers", "--worker-address", address,
                           "--worker-secret", SECRET, "--pipeline-parallel-size", "2")
    workers: list[WorkerProcess] = []

    def worker(name: str, rank: int, model, secret: str = SECRET) -> WorkerProcess:
        workers.append(WorkerProcess(tmp_path / f"{name}.log", address, rank, "-pp", "2", "--model", str(model),
                                     secret=secret))
        return workers[-1]

    try:
        impostor = worker("wrong-secret", 0, tiny_model, secret="not-the-secret-0123456789")
        assert impostor.wait(60) == REFUSED, impostor.log_tail()
        assert "could not prove it knows the worker secret" in impostor.log()
        assert_logged(server, rf"refused worker rank 0 \(CPU, pid {impostor.proc.pid}\) at 127\.0\.0\.1: "
                              r"it does not know the worker secret")

        other = worker("other-model", 1, make_tiny_gguf(tmp_path / "other.gguf", seed=1))
        assert other.wait(60) == REFUSED, other.log_tail()
        assert "refused by the scheduler: a different model" in other.log()
        assert_logged(server, rf"refused worker rank 1 \(CPU, pid {other.proc.pid}\) at 127\.0\.0\.1: "
                              r"a different model")
        assert READY_LINE not in server.log() and server.proc.poll() is None

        stage0, stage1 = worker("rank0", 0, tiny_model), worker("rank1", 1, tiny_model)
        server.wait_ready()
        assert complete(server.url)
        assert_logged(server, r"worker rank 1 \(CPU, pid \d+\) at 127\.0\.0\.1 joined")

        ctx = zmq.Context()
        try:  # a stranger on the worker socket: a forged error would stop the engine if it were read
            stranger = ctx.socket(zmq.DEALER)
            stranger.connect(address)
            stranger.send(encode(WorkerError(0, "forged")))
            stranger.send(b"\xc1 not msgpack")
            stage_input = stage1.wait_for_log(r"this stage's input is at (tcp://\S+)", 5).group(1)
            pusher = ctx.socket(zmq.PUSH)  # and one at the last stage's input, with an input of the right size
            pusher.connect(stage_input)
            pusher.send_multipart([msgpack.packb({"shape": [1, 64], "dtype": "float32"}), bytes(256)])
            assert complete(server.url)  # the scheduler reads its worker socket while a step runs
            assert_logged(server, r"ignoring messages from a peer at 127\.0\.0\.1 that is not one of the admitted")
            stage1.wait_for_log("dropped a message at this stage's input that the previous stage did not seal", 30)
            assert complete(server.url)
        finally:
            ctx.destroy(linger=0)

        assert not server.stop(), f"processes left running: {server.leftover_description}"
        assert [stage0.wait(30), stage1.wait(30)] == [0, 0], stage0.log_tail() + stage1.log_tail()
    finally:
        for w in workers:
            w.kill()
        server.stop()
