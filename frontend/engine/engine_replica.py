"""One engine replica: a process group (a scheduler and its tensor x pipeline-parallel workers, which live and die
as a unit) and the EngineClient that speaks to it, restarted with backoff when the group fails.

The group fails when the client says so (a process exited, or no step finished within the step timeout: its
open requests have already ended with that error). The whole group is then stopped, stragglers killed (a
SIGSTOPped worker ignores SIGTERM until SIGKILL), and a fresh one started after 1, 2, 4, ... s. Restarts that fail
in a row, or groups that die within `stable_after_s` of serving, count towards `max_attempts`; past it the replica
gives up and supervise() returns, so that the server can exit non-zero and its service manager restart it.
"""
import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tinyvllm.protocol.messages import EngineReady, SchedulerStats

log = logging.getLogger("tinyvllm.frontend")
FAILURE_POLL_S = 0.25  # how often the client is checked for a failure (it notices one within PROCESS_POLL_S)
FAILED_GROUP_GRACE_S = 1.0  # a failed group's processes may exit on their own this long, then SIGTERM, SIGKILL


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    max_attempts: int = 5  # restarts in a row before giving up (0: never restart)
    stable_after_s: float = 60.0  # a group that served this long before it failed starts a new series

    def delay_s(self, attempt: int) -> float:
        return min(self.first_delay_s * 2 ** (attempt - 1), self.max_delay_s)


class EngineReplica:
    def __init__(self, index: int, launch: Callable[[], tuple[Any, Any]], name: str = "engine",
                 restart: RestartPolicy = RestartPolicy(), clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Any] = asyncio.sleep):
        """launch() -> (a process group, as EngineProcesses: start/dead_process/stop; its EngineClient), both new
        and not started yet."""
        self.index, self.name, self.restart = index, name, restart
        self._launch, self._clock, self._sleep = launch, clock, sleep
        self.group = self.client = None
        self.serving = False
        self.gave_up = False
        self.attempts = 0  # restarts since the last group that served long enough
        self._failure: str | None = None  # why it does not serve, once the supervisor knows
        self._ready_at = 0.0

    @property
    def available(self) -> bool:
        return self.serving and self.client.dead_reason is None

    @property
    def failure(self) -> str:
        """Why the replica does not serve now."""
        return self._failure or (self.client and self.client.dead_reason) or f"{self.name} is not serving"

    @property
    def stats(self) -> SchedulerStats:
        return self.client.stats if self.available else SchedulerStats()

    async def start(self, timeout_s: float) -> EngineReady:
        """Launches a fresh group and waits until it is ready (raises if it is not)."""
        self.group, self.client = self._launch()
        self.group.start()
        ready = await self.client.start(timeout_s, self.group.dead_process)
        self.serving, self._failure, self._ready_at = True, None, self._clock()
        pids = [p.pid for p in getattr(self.group, "processes", [])]
        if pids:
            log.info("%s serving (scheduler pid %d, worker pids %s)", self.name, pids[0],
                     " ".join(map(str, pids[1:])) or "external")
        return ready

    async def supervise(self, timeout_s: float, on_ready: Callable[[EngineReady], None],
                        on_failed: Callable[[], None] = lambda: None) -> str:
        """Restarts the group each time it fails, calling on_failed() when it does and on_ready(EngineReady) after
        each restart; returns why it gave up."""
        while True:
            while (reason := self.client.dead_reason) is None:
                await self._sleep(FAILURE_POLL_S)
            self.serving, self._failure = False, reason
            on_failed()
            if self._clock() - self._ready_at >= self.restart.stable_after_s:
                self.attempts = 0
            while True:
                await self._discard()
                if self.attempts >= self.restart.max_attempts:
                    self.gave_up = True
                    self._failure = f"{self.name} gave up after {self.attempts} restarts: {reason}"
                    log.error("%s", self._failure)
                    return self._failure
                self.attempts += 1
                delay = self.restart.delay_s(self.attempts)
                log.error("%s failed (%s); restart %d of at most %d in %g s", self.name, reason, self.attempts,
                          self.restart.max_attempts, delay)
                self._failure = f"{self.name} is restarting after a failure: {reason}"
                await self._sleep(delay)
                try:
                    on_ready(await self.start(timeout_s))
                    break
                except Exception as e:
                    reason = f"{self.name} did not restart: {e or type(e).__name__}"

    async def _discard(self) -> None:
        """Closes the client and stops the group (kept referenced until stopped, so stop_processes sees it)."""
        if self.client is not None:
            await self.client.close()
        if self.group is not None:
            await asyncio.to_thread(self.group.stop, FAILED_GROUP_GRACE_S)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    def stop_processes(self) -> None:
        if self.group is not None:
            self.group.stop()
