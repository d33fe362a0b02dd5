"""Helpers for servers with data-parallel replicas: each replica's processes (from the frontend's log), its metrics
(the `engine` label), and long streamed requests run in threads while a test breaks something."""
from __future__ import annotations

import re
import threading
import time
from typing import Callable

from tests.e2e.http_helpers import StreamResult, completion_body, stream
from tests.e2e.server_process import ServerProcess, metrics_text, read_metric, wait_until

SERVING_LINE = re.compile(r"(engine(?: \d+)?) serving \(scheduler pid (\d+), worker pids ([\d ]+)\)")


def serving_lines(server: ServerProcess, engine: str) -> list[tuple[int, list[int]]]:
    """(scheduler pid, worker pids) of every group `engine` ("engine 1"; "engine" alone) has started, in order."""
    return [(int(m.group(2)), [int(p) for p in m.group(3).split()])
            for m in SERVING_LINE.finditer(server.log()) if m.group(1) == engine]


def current_workers(server: ServerProcess, engine: str) -> list[int]:
    return serving_lines(server, engine)[-1][1]


def engine_metric(server: ServerProcess, name: str, engine: str) -> float:
    return read_metric(server.url, name, f'engine="{engine}"')


def per_engine(server: ServerProcess, name: str, engines: tuple[str, ...]) -> dict[str, float]:
    """`name`'s value for each of `engines`, from one read of /metrics."""
    text = metrics_text(server.url)
    return {e: read_metric(server.url, name, f'engine="{e}"', text) for e in engines}


class LongStreams:
    """`count` long streamed completions, each in its own thread, started a little apart, or (one_at_a_time) each
    once the one before has streamed its first event: the frontend has then read a report of its replica that counts
    it, so the replicas' loads are current when the next one is routed (a count read from /metrics instead may never
    show them all running: a starved frontend reads its engines' reports late, and an engine may have finished a
    stream it still shows running); each result notes when its stream ended. hang_up() ends the streams still
    running as a client that goes away would."""

    def __init__(self, url: str, count: int, max_tokens: int, one_at_a_time: bool = False,
                 describe: Callable[[], object] = lambda: None):
        self.live = [StreamResult(0) for _ in range(count)]
        self.results: list[StreamResult | None] = [None] * count
        self.ended_at: list[float] = [0.0] * count
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(url, i, max_tokens), daemon=True)
                        for i in range(count)]
        for i, t in enumerate(self.threads):
            t.start()
            if not one_at_a_time:
                time.sleep(0.2)
            else:
                assert wait_until(lambda: self.live[i].events, 60), \
                    (f"stream {i} did not start", [(r.finish_reason, r.errors, r.events[-2:]) if r else None
                                                   for r in self.results], describe())

    def _run(self, url: str, i: int, max_tokens: int) -> None:
        body = completion_body(f"Story {i}:", max_tokens=max_tokens, ignore_eos=True, temperature=0)
        self.results[i] = stream(url, "/v1/completions", body, result=self.live[i], stop=self.stop)
        self.ended_at[i] = time.monotonic()

    def join(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def hang_up(self, timeout_s: float) -> bool:
        self.stop.set()
        return self.join(timeout_s)
