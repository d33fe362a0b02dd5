"""Every container of deploy/kubernetes with the `tinyvllm` command line the image's entrypoint would exec for it."""
from dataclasses import dataclass

import pytest

from tests.deploy.entrypoint_runner import run_entrypoint
from tests.deploy.kube import Pod, container_args, container_env, containers


@dataclass
class Started:
    pod: Pod
    container: dict
    env: dict[str, str]
    argv: list[str]  # what tinyvllm was exec'd with, without the program name

    @property
    def name(self) -> str:
        return self.pod.describe(self.container)


@pytest.fixture(scope="session")
def started(tmp_path_factory) -> list[Started]:
    out = []
    for pod, container in containers():
        env = container_env(pod, container)
        run = run_entrypoint(tmp_path_factory.mktemp("entrypoint"), container_args(pod, container), env)
        assert run.returncode == 0 and run.argv, f"{pod.describe(container)}: {run.stderr}"
        out.append(Started(pod, container, env, run.argv))
    return out
