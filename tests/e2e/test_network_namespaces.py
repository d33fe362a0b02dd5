"""Workers on other machines: the server (frontend and scheduler) and each pipeline stage in a network namespace of
its own (tests/e2e/network_namespaces.py), over tcp:// through a bridge, with a shared secret. Each stage joins
from its own address, the last stage listens on its machine's address (the default --stage-address), and a client
in the server's namespace gets its completion. Skipped only where namespaces cannot be made, saying why."""
import json
import re
import subprocess
import sys

import pytest

from tests.e2e.network_namespaces import Namespaces, cannot_make_namespaces
from tests.e2e.server_process import REQUEST_TIMEOUT_S, ServerProcess
from tests.e2e.worker_process import WorkerProcess

SECRET = "e2e-namespaces-secret-0123456789"
CLIENT = """
import json, sys, httpx
r = httpx.post(sys.argv[1] + "/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 4},
               timeout=float(sys.argv[2]))
print(json.dumps({"status": r.status_code, "body": r.json()}))
"""


@pytest.fixture
def machines():
    if (why := cannot_make_namespaces()) is not None:
        pytest.skip(f"network namespaces cannot be made here: {why}")
    namespaces = Namespaces(3)  # the server's, stage 0's, stage 1's
    yield namespaces
    namespaces.close()


def test_each_pipeline_stage_on_its_own_machine(machines, tiny_model, tmp_path):
    address = f"tcp://{machines.addresses[0]}:7000"
    server = ServerProcess(tiny_model, tmp_path / "server.log", "--external-workers", "--worker-address", address,
                           "--worker-secret", SECRET, "--pipeline-parallel-size", "2",
                           command_prefix=machines.exec_prefix(0))
    stages = [WorkerProcess(tmp_path / f"stage{rank}.log", address, rank, "-pp", "2", "--model", str(tiny_model),
                            secret=SECRET, command_prefix=machines.exec_prefix(rank + 1)) for rank in (0, 1)]
    try:
        server.wait_ready()
        for rank in (0, 1):
            ip = re.escape(machines.addresses[rank + 1])
            assert re.search(rf"worker rank {rank} \(CPU, pid \d+\) at {ip} joined", server.log()), server.log_tail()
        stages[1].wait_for_log(rf"this stage's input is at tcp://{re.escape(machines.addresses[2])}:\d+", 5)

        client = subprocess.run([*machines.exec_prefix(0), sys.executable, "-c", CLIENT, server.url,
                                 str(REQUEST_TIMEOUT_S)], capture_output=True, text=True,
                                timeout=REQUEST_TIMEOUT_S + 30)
        assert client.returncode == 0, client.stderr
        answer = json.loads(client.stdout)
        assert answer["status"] == 200 and answer["body"]["usage"]["completion_tokens"] == 4, answer

        assert not server.stop(), f"processes left running: {server.leftover_description}"
        assert [s.wait(30) for s in stages] == [0, 0], stages[0].log_tail() + stages[1].log_tail()
    finally:
        for stage in stages:
            stage.kill()
        server.stop()
