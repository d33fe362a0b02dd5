"""ZMQ endpoints and sockets. ipc:// in a private temporary folder by default, tcp:// when asked."""
import os
import socket
import tempfile
from dataclasses import dataclass

import zmq
import zmq.asyncio

from tinyvllm.protocol.codec import MAX_MESSAGE_BYTES, decode, encode_to_send


@dataclass(slots=True)
class Endpoints:
    scheduler_input: str   # frontend PUSH -> scheduler PULL (bound by the scheduler)
    frontend_output: str   # scheduler PUSH -> frontend PULL (bound by the frontend)
    workers: str           # scheduler ROUTER <-> worker DEALERs (bound by the scheduler)

    @staticmethod
    def ipc(folder: str | None = None) -> "Endpoints":
        folder = folder or tempfile.mkdtemp(prefix="tinyvllm-")
        os.chmod(folder, 0o700)
        return Endpoints(*(f"ipc://{os.path.join(folder, name)}" for name in ("sched_in", "front_out", "workers")))

    @staticmethod
    def tcp(host: str = "127.0.0.1", base_port: int = 5555) -> "Endpoints":
        return Endpoints(*(f"tcp://{host}:{base_port + i}" for i in range(3)))

    def stage_input(self, rank: int) -> str:
        """Where worker `rank` (a pipeline stage after the first) receives its input: beside the other endpoints."""
        if self.workers.startswith("ipc://"):
            return f"{self.workers.rsplit('/', 1)[0]}/stage-{rank}"
        host, port = self.workers[len("tcp://"):].rsplit(":", 1)
        return f"tcp://{host}:{int(port) + 1 + rank}"


def local_ip_towards(endpoint: str) -> str:
    """This host's IPv4 address that its route to a tcp:// endpoint leaves from (found without sending anything)."""
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, int(port)))
        return probe.getsockname()[0]


def make_socket(ctx: zmq.Context, kind: int, addr: str, bind: bool, identity: bytes | None = None,
                options: dict[int, int] | None = None) -> zmq.Socket:
    """options: further socket options, set before binding or connecting."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    sock.setsockopt(zmq.LINGER, 0)
    for option, value in (options or {}).items():
        sock.setsockopt(option, value)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if kind == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    (sock.bind if bind else sock.connect)(addr)
    return sock


def send(sock: zmq.Socket, msg, identity: bytes | None = None) -> None:
    """Raises codec.MessageTooLarge, sending nothing, for a message over the bound (its peer would drop it)."""
    data = encode_to_send(msg)
    if identity is None:
        sock.send(data, copy=False)
    else:
        sock.send_multipart([identity, data], copy=False)


def recv(sock: zmq.Socket):
    return decode(sock.recv())


async def send_async(sock: zmq.asyncio.Socket, msg) -> None:
    await sock.send(encode_to_send(msg), copy=False)


async def recv_async(sock: zmq.asyncio.Socket):
    return decode(await sock.recv())
