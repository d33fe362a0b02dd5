"""The scheduler's KV-cache events on a ZMQ PUB socket, framed as vLLM frames them (protocol/kv_events.py), with
vLLM's replay socket (a ROUTER: a subscriber that missed batches sends [b"", start sequence as 8 bytes big-endian]
and gets [b"", sequence, batch] for each one kept from there on, then [b"", -1 as 8 bytes, b""]).

The scheduler's loop publishes the block pool's events once per pass (a batch holds a pass's stores and
evictions). A restarted engine's cache is empty, and subscribers must drop what they knew of the one before: batch 0,
sent at start, is AllBlocksCleared (for replay: PUB drops what it sends before a subscription reaches it), and the
first batch with events starts with it again, by when subscribers have had the engine's start-up to connect. PUB
never blocks: a subscriber too slow for the high-water mark loses messages and asks the replay socket for them. The
replay socket is served by a thread of its own, which blocks on it until close(); the PUB socket stays the loop's.
"""
import collections
import logging
import threading
import time

import msgpack
import zmq

from tinyvllm.protocol.kv_events import AllBlocksCleared, KVEvent, event_batch
from tinyvllm.protocol.kv_events_config import KVEventsConfig, binds, ipv6

log = logging.getLogger("tinyvllm.scheduler")
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
MAX_REPLAY_REQUEST_BYTES = 64


class KVEventPublisher:
    def __init__(self, ctx: zmq.Context, config: KVEventsConfig, data_parallel_rank: int = 0):
        config = config.for_rank(data_parallel_rank)
        self.rank, self.topic = data_parallel_rank, config.topic.encode()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, config.hwm)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.IPV6, ipv6(config.endpoint))
        (self.pub.bind if binds(config.endpoint) else self.pub.connect)(config.endpoint)
        self.next_seq = 0
        self.kept: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=config.buffer_steps)
        self.kept_lock = threading.Lock()
        self.replay_thread: threading.Thread | None = None
        if config.replay_endpoint is not None:
            replay = ctx.socket(zmq.ROUTER)  # bound here, so that a taken address fails the start; then the thread's
            replay.setsockopt(zmq.MAXMSGSIZE, MAX_REPLAY_REQUEST_BYTES)
            replay.setsockopt(zmq.LINGER, 0)
            replay.setsockopt(zmq.IPV6, ipv6(config.replay_endpoint))
            replay.bind(config.replay_endpoint)
            stop_address = f"inproc://kv-events-replay-stop-{id(self)}"
            stop = ctx.socket(zmq.PAIR)
            stop.bind(stop_address)
            self.stop = ctx.socket(zmq.PAIR)
            self.stop.connect(stop_address)
            self.replay_thread = threading.Thread(target=self._serve_replays, args=(replay, stop),
                                                  name="kv-events-replay", daemon=True)
            self.replay_thread.start()
        log.info("KV events on %s%s", config.endpoint,
                 f", replay on {config.replay_endpoint}" if config.replay_endpoint else "")
        self.cleared_live = True
        self.publish([AllBlocksCleared()])
        self.cleared_live = False  # batch 0 most likely reached no subscriber: the first batch with events says it again

    def publish(self, events: list[KVEvent]) -> None:
        if not self.cleared_live and events:
            events, self.cleared_live = [AllBlocksCleared(), *events], True
        payload = msgpack.packb(event_batch(time.time(), events, self.rank))
        seq = self.next_seq.to_bytes(8, "big")
        with self.kept_lock:
            self.kept.append((self.next_seq, payload))
        self.next_seq += 1
        try:
            self.pub.send_multipart((self.topic, seq, payload), flags=zmq.NOBLOCK)
        except zmq.Again:  # a PUB socket drops rather than blocks; replay has the batch
            pass

    def _serve_replays(self, replay: zmq.Socket, stop: zmq.Socket) -> None:
        """Answers replay requests until close() says stop (the thread owns both sockets: ZMQ's are not shared)."""
        poller = zmq.Poller()
        poller.register(replay, zmq.POLLIN)
        poller.register(stop, zmq.POLLIN)
        try:
            while stop not in dict(poller.poll()):
                try:
                    frames = replay.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:  # a request over the size bound was dropped
                    continue
                if len(frames) != 3 or len(frames[2]) != 8:
                    log.warning("ignored a malformed KV event replay request (%d frames)", len(frames))
                    continue
                client, start = frames[0], int.from_bytes(frames[2], "big")
                with self.kept_lock:
                    batches = [(seq, payload) for seq, payload in self.kept if seq >= start]
                for seq, payload in batches:
                    replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
                replay.send_multipart((client, b"", END_OF_REPLAY, b""))
        finally:
            replay.close(linger=0)
            stop.close(linger=0)

    def close(self) -> None:
        self.pub.close(linger=0)
        if self.replay_thread is not None:
            try:
                self.stop.send(b"", zmq.NOBLOCK)
            except zmq.Again:  # the thread is gone already
                pass
            self.replay_thread.join(5)
            self.stop.close(linger=0)
