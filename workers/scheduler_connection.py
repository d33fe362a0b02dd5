"""A worker's socket to the scheduler, and noticing when the scheduler is gone.

The DEALER sends ZMQ heartbeats, so a scheduler that died without closing its connections (a lost machine, a
broken network) is noticed like one that exited: the worker stops with NoScheduler instead of waiting forever for a
plan. A standalone worker then exits with code 1, and a service manager (systemd's Restart=on-failure) starts it
again to join the next scheduler; the engine's state died with the old one anyway.
"""
import zmq
from zmq.utils.monitor import recv_monitor_message

from tinyvllm.protocol.codec import MessageTooLarge
from tinyvllm.protocol.message_parts import split_step_result
from tinyvllm.protocol.messages import StepResult
from tinyvllm.protocol.transport import make_socket, recv, send
from tinyvllm.workers.scheduler_join import NoScheduler

HEARTBEAT_INTERVAL_MS = 5_000
HEARTBEAT_TIMEOUT_MS = 60_000  # ZMQ's own I/O threads answer pings: a long step or jit capture does not count


def connect_to_scheduler(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    return make_socket(ctx, zmq.DEALER, endpoint, bind=False,  # the scheduler's ROUTER names each peer
                       options={zmq.HEARTBEAT_IVL: HEARTBEAT_INTERVAL_MS, zmq.HEARTBEAT_TIMEOUT: HEARTBEAT_TIMEOUT_MS})


def send_step_result(sock: zmq.Socket, result: StepResult) -> None:
    """One message, or, when that would be over the message bound, several parts of the step split by rows.
    MessageTooLarge (nothing sent) when one row alone is over it."""
    try:
        send(sock, result)
        return
    except MessageTooLarge:
        pass  # split outside the handler: an error while splitting is not "during handling" of this one
    for part in split_step_result(result):
        send(sock, part)


class SchedulerWatch:
    """The scheduler's messages after the handshake; raises NoScheduler once the connection is gone."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.poller = zmq.Poller()
        self.poller.register(sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.others: dict[zmq.Socket, object] = {}

    def serve_also(self, sock: zmq.Socket, handler) -> None:
        """While waiting for the scheduler, call handler() whenever sock has messages (the KV side channel)."""
        self.others[sock] = handler
        self.poller.register(sock, zmq.POLLIN)

    def recv(self, timeout_ms: int | None = None):
        """The scheduler's next message; None once timeout_ms passed without one (None: wait for it)."""
        while True:
            ready = dict(self.poller.poll(timeout_ms))
            for sock, handler in self.others.items():
                if sock in ready:
                    handler()
            if self.sock in ready:
                return recv(self.sock)
            if self.monitor not in ready:
                if timeout_ms is not None:
                    return None
                continue
            recv_monitor_message(self.monitor)
            if not self.sock.poll(0):  # what the scheduler sent before it went (a Shutdown) comes first
                raise NoScheduler("the connection to the scheduler dropped")
