"""deploy/workers.sh places its workers through `tinyvllm worker --local-index I --local-count N`, the launcher's own
rule (protocol/device_placement.py), instead of computing devices and cores in shell."""
import os
import pathlib
import shutil
import subprocess

import pytest

from tinyvllm.frontend.cli.main import build_parser
from tinyvllm.frontend.cli.worker_command import placement_from
from tinyvllm.protocol.device_placement import device_placement

REPO = pathlib.Path(__file__).resolve().parents[2]
FAKE_TINYVLLM = """#!/usr/bin/env bash
echo "DEV=$DEV $*" >> "$(dirname "$0")/calls"
sleep 1  # workers.sh stops the others when the first one exits: each has written its line by then
"""


def started_workers(tmp_path, *flags, dev: str) -> list[list[str]]:
    """The command lines deploy/workers.sh starts, with a stand-in for .venv/bin/tinyvllm."""
    (tmp_path / "deploy").mkdir()
    shutil.copy(REPO / "deploy" / "workers.sh", tmp_path / "deploy" / "workers.sh")
    fake = tmp_path / ".venv" / "bin" / "tinyvllm"
    fake.parent.mkdir(parents=True)
    fake.write_text(FAKE_TINYVLLM)
    fake.chmod(0o755)
    env = {**os.environ, "DEV": dev, "PATH": "/usr/bin:/bin"}  # no nvidia-smi: the count comes from --count
    subprocess.run(["bash", str(tmp_path / "deploy" / "workers.sh"), *flags], env=env, check=True, timeout=30)
    return sorted(line.split() for line in (fake.parent / "calls").read_text().splitlines())


def test_each_worker_gets_its_local_index_and_the_launchers_placement(tmp_path):
    calls = started_workers(tmp_path, "--count", "2", "--first-rank", "2", "--connect", "tcp://10.0.0.1:7000",
                            dev="CPU")
    assert [c[0] for c in calls] == ["DEV=CPU", "DEV=CPU"]
    parsed = [build_parser().parse_args(c[1:]) for c in calls]
    assert [(a.rank, a.local_index, a.local_count) for a in parsed] == [(2, 0, 2), (3, 1, 2)]
    placements = [placement_from(a, {"DEV": "CPU"}) for a in parsed]
    assert placements == [device_placement(0, 2, {"DEV": "CPU"}), device_placement(1, 2, {"DEV": "CPU"})]
    cores = [set(p["TINYVLLM_CPU_CORES"].split(",")) for p in placements]
    assert not cores[0] & cores[1]  # two workers never share a core when there are enough


def test_on_gpus_worker_i_takes_device_i():
    args = build_parser().parse_args(["worker", "--connect", "tcp://h:1", "--rank", "1", "--local-index", "1",
                                      "--local-count", "4"])
    assert placement_from(args, {"DEV": "CUDA"}) == {"DEV": "CUDA:1"}


@pytest.mark.parametrize("flags, message", [(["--local-index", "0"], "go together"),
                                            (["--local-index", "4", "--local-count", "4"], "between 0 and 3")])
def test_a_wrong_local_index_is_refused(flags, message):
    args = build_parser().parse_args(["worker", "--connect", "tcp://h:1", "--rank", "0", *flags])
    with pytest.raises(ValueError, match=message):
        placement_from(args, {"DEV": "CPU"})
