"""EngineReplica's supervision on a fake clock: a failed group is stopped and a new one started after 1, 2, 4, ... s;
restarts that keep failing (or groups that die soon after serving) make it give up after RestartPolicy.max_attempts;
a group that served long enough before failing starts a new series."""
import asyncio

import pytest

from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.engine.engine_replica import FAILED_GROUP_GRACE_S, EngineReplica, RestartPolicy
from tinyvllm.protocol.messages import EngineReady

READY = EngineReady(num_blocks=32, block_size=16, max_model_len=256, max_num_seqs=8, num_workers=1)


class FakeGroup:
    def __init__(self):
        self.started = False
        self.stop_grace: list[float] = []

    def start(self) -> None:
        self.started = True

    def dead_process(self) -> str | None:
        return None

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stop_grace.append(timeout_s)


class FakeClient:
    def __init__(self, fails_to_start: bool):
        self.fails_to_start = fails_to_start
        self.dead_reason: str | None = None
        self.closed = False

    async def start(self, timeout_s, dead_process=None) -> EngineReady:
        if self.fails_to_start:
            raise EngineDeadError("engine failed to start: tinyvllm-worker0 exited with code 1")
        return READY

    async def close(self) -> None:
        self.closed = True


class Launches:
    """launch() for the replica: the k-th group starts or fails as `fails[k]` says (later ones start)."""

    def __init__(self, fails: list[bool] = ()):
        self.fails = list(fails)
        self.made: list[tuple[FakeGroup, FakeClient]] = []

    def __call__(self) -> tuple[FakeGroup, FakeClient]:
        k = len(self.made)
        self.made.append((FakeGroup(), FakeClient(k < len(self.fails) and self.fails[k])))
        return self.made[-1]


class FakeTime:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        """A backoff moves the clock; the supervisor's polls for a failure do not (tests move it themselves)."""
        if seconds >= RestartPolicy().first_delay_s:
            self.now += seconds
            self.sleeps.append(seconds)
        await asyncio.sleep(0)


async def supervised(launches: Launches, policy: RestartPolicy = RestartPolicy()):
    time = FakeTime()
    replica = EngineReplica(0, launches, "engine", policy, clock=time.clock, sleep=time.sleep)
    await replica.start(5)
    readies = []
    task = asyncio.create_task(replica.supervise(5, readies.append, lambda: readies.append("failed")))
    return replica, time, task, readies


async def until(predicate, timeout_s: float = 5.0) -> None:
    """Real time: the replica stops a failed group on a thread."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0.001)


@pytest.mark.anyio
async def test_a_failed_group_is_stopped_and_replaced_after_a_second():
    launches = Launches()
    replica, time, task, readies = await supervised(launches)
    assert replica.available and replica.attempts == 0
    first_group, first_client = launches.made[0]
    first_client.dead_reason = "engine process died (tinyvllm-worker0 exited with code -9)"
    assert not replica.available and "worker0 exited" in replica.failure
    await until(lambda: len(readies) == 2)
    assert readies[0] == "failed" and readies[1] != "failed"  # told at once, then the new group's EngineReady
    assert time.sleeps == [1.0] and len(launches.made) == 2 and replica.available
    assert first_client.closed and first_group.stop_grace == [FAILED_GROUP_GRACE_S]
    assert replica.client is launches.made[1][1] and launches.made[1][0].started
    task.cancel()


@pytest.mark.anyio
async def test_failing_restarts_back_off_and_then_give_up():
    launches = Launches(fails=[False] + [True] * 10)
    replica, time, task, _ = await supervised(launches)
    launches.made[0][1].dead_reason = "engine stopped answering: no step finished within 5 s"
    reason = await asyncio.wait_for(task, 5)
    assert time.sleeps == [1, 2, 4, 8, 16]
    assert len(launches.made) == 6  # the first group and five attempts
    assert reason.startswith("engine gave up after 5 restarts") and "failed to start" in reason
    assert replica.gave_up and not replica.available and replica.failure == reason
    assert all(group.stop_grace for group, _ in launches.made)  # every failed group was stopped


def test_the_delay_is_capped():
    policy = RestartPolicy(max_attempts=8, max_delay_s=10)
    assert [policy.delay_s(k) for k in range(1, 9)] == [1, 2, 4, 8, 10, 10, 10, 10]


@pytest.mark.anyio
async def test_groups_that_die_soon_after_serving_count_towards_giving_up():
    launches = Launches()
    replica, time, task, readies = await supervised(launches, RestartPolicy(max_attempts=2))
    for k in range(2):
        launches.made[-1][1].dead_reason = "engine process died"
        await until(lambda: len(readies) == 2 * (k + 1))  # its failure, then its restart
        time.now += 10  # served 10 s: less than stable_after_s
    launches.made[-1][1].dead_reason = "engine process died"
    assert (await asyncio.wait_for(task, 5)).startswith("engine gave up after 2 restarts")
    assert time.sleeps == [1, 2]


@pytest.mark.anyio
async def test_a_group_that_served_long_enough_starts_a_new_series():
    launches = Launches()
    replica, time, task, readies = await supervised(launches, RestartPolicy(max_attempts=1))
    for k in range(3):
        time.now += 61
        launches.made[-1][1].dead_reason = "engine process died"
        await until(lambda: len(readies) == 2 * (k + 1))  # its failure, then its restart
    assert time.sleeps == [1, 1, 1] and replica.available and not task.done()
    task.cancel()


@pytest.mark.anyio
async def test_no_restarts_at_all():
    launches = Launches()
    replica, time, task, _ = await supervised(launches, RestartPolicy(max_attempts=0))
    launches.made[0][1].dead_reason = "engine process died"
    assert await asyncio.wait_for(task, 5) == "engine gave up after 0 restarts: engine process died"
    assert len(launches.made) == 1 and launches.made[0][0].stop_grace and time.sleeps == []
