"""`--async-scheduling/--no-async-scheduling` reach EngineArgs (serve and bench throughput); the launcher turns it on
only for one worker, with two steps in flight, and keeps P steps in flight (and it off) for P pipeline stages."""
import json

import pytest

from tinyvllm.frontend.cli import build_parser, engine_args_from
from tinyvllm.frontend.launcher import EngineArgs, EngineProcesses


@pytest.mark.parametrize("command", [["serve"], ["bench", "throughput"]])
def test_the_flag_reaches_the_engine_args(command):
    parse = build_parser().parse_args
    assert engine_args_from(parse(command)).async_scheduling is EngineArgs().async_scheduling is True
    assert engine_args_from(parse(command + ["--no-async-scheduling"])).async_scheduling is False
    assert engine_args_from(parse(command + ["--async-scheduling"])).async_scheduling is True


@pytest.mark.parametrize("flags, expected", [
    (dict(), (True, 2)),
    (dict(async_scheduling=False), (False, 1)),
    (dict(tensor_parallel_size=2), (False, 1)),
    (dict(pipeline_parallel_size=2), (False, 2)),
])
def test_the_scheduler_schedules_asynchronously_only_for_one_worker(tiny_model, flags, expected):
    procs = EngineProcesses(EngineArgs(model=tiny_model, **flags))
    try:
        _, args = json.loads(procs.processes[0].command[-1])
        assert (args["async_scheduling"], args["max_steps_in_flight"]) == expected
    finally:
        procs.stop()
