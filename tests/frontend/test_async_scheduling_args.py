"""`--async-scheduling/--no-async-scheduling` reach the EngineConfig (serve and bench throughput); the scheduler the
launcher starts turns it on only for one worker, with two steps in flight, and keeps P steps in flight (and it off)
for P pipeline stages."""
import pytest

from tinyvllm.frontend.cli.main import build_parser
from tinyvllm.frontend.engine.launcher import EngineProcesses
from tinyvllm.protocol.child_process import child_args
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.process_args import SchedulerArgs
from tinyvllm.protocol.transport import Endpoints
from tinyvllm.scheduler.main import scheduler_config


@pytest.mark.parametrize("command", [["serve"], ["bench", "throughput"]])
def test_the_flag_reaches_the_engine_args(command):
    parse = build_parser().parse_args
    def flag(argv):
        return EngineConfig.from_namespace(parse(argv)).batch.async_scheduling
    assert flag(command) is EngineConfig().batch.async_scheduling is EngineConfig.of().batch.async_scheduling is True
    assert flag(command + ["--no-async-scheduling"]) is False
    assert flag(command + ["--async-scheduling"]) is True


@pytest.mark.parametrize("flags, expected", [
    (dict(), (True, 2)),
    (dict(async_scheduling=False), (False, 1)),
    (dict(tensor_parallel_size=2), (False, 1)),
    (dict(pipeline_parallel_size=2), (False, 2)),
])
def test_the_scheduler_schedules_asynchronously_only_for_one_worker(tiny_model, flags, expected):
    procs = EngineProcesses(EngineConfig.of(model=tiny_model, **flags))
    try:  # the scheduler's arguments as its process rebuilds them from its command line, and what it derives
        _, args = child_args(procs.processes[0].command[-2:], Endpoints, SchedulerArgs)
        assert (args.engine.runs_async, args.engine.max_steps_in_flight) == expected
        config = scheduler_config(args, 64)
        assert (config.async_scheduling, config.max_steps_in_flight) == expected
    finally:
        procs.stop()
