"""The Kubernetes manifests of deploy/kubernetes as the tests see them: every object with the file it came from,
each pod template (a LeaderWorkerSet's once per pod of its group, with the variables LeaderWorkerSet injects), and
each container's environment and args as the kubelet makes them ($(VAR) expanded), then run through the image's
entrypoint (tests/deploy/entrypoint_runner.py) into the `tinyvllm` command line the container runs."""
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "deploy" / "kubernetes"
KUSTOMIZATION = "kustomization.yaml"
POD_IP = "10.1.2.3"  # what the downward API would give


def manifest_files() -> list[Path]:
    return sorted(p for p in KUBE.rglob("*.yaml") if p.name != KUSTOMIZATION)


@functools.cache
def objects() -> list[tuple[Path, dict]]:
    """Every object of every manifest, with its file (loaded once: copy before changing one)."""
    return [(path, doc) for path in manifest_files() for doc in yaml.safe_load_all(path.read_text()) if doc]


def find(kind: str, name: str) -> dict:
    (obj,) = [doc for _, doc in objects() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    return obj


def sample_secret(name: str, key: str) -> str:
    return f"secret-{name}-{key}-0123456789abcdef"


@dataclass
class Pod:
    """One pod as a workload would create it."""
    workload: dict
    path: Path
    template: dict  # metadata + spec
    injected: dict[str, str] = field(default_factory=dict)  # LeaderWorkerSet's variables, first in every container

    @property
    def spec(self) -> dict:
        return self.template["spec"]

    @property
    def labels(self) -> dict:
        return self.template["metadata"]["labels"]

    def describe(self, container: dict) -> str:
        index = f" pod {self.injected['LWS_WORKER_INDEX']}" if self.injected else ""
        return f"{self.path.relative_to(REPO)}: {self.workload['metadata']['name']}{index} container {container['name']}"


@functools.cache
def pods() -> list[Pod]:
    out = []
    for path, doc in objects():
        if doc["kind"] == "Deployment":
            out.append(Pod(doc, path, doc["spec"]["template"]))
        elif doc["kind"] == "LeaderWorkerSet":
            group = doc["spec"]["leaderWorkerTemplate"]
            name, size = doc["metadata"]["name"], group["size"]
            for index in range(size):
                template = group["leaderTemplate"] if index == 0 else group["workerTemplate"]
                out.append(Pod(doc, path, template, {"LWS_LEADER_ADDRESS": f"{name}-0.{name}.default",
                                                     "LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": str(index)}))
    return out


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion: a defined variable's value, $$ for a literal $, anything else as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def container_env(pod: Pod, container: dict) -> dict[str, str]:
    """envFrom (ConfigMaps of the manifests), then env in order, each value expanded with those before it."""
    env = {}
    for source in container.get("envFrom", []):
        env.update(find("ConfigMap", source["configMapRef"]["name"])["data"])
    env.update(pod.injected)
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = sample_secret(ref["name"], ref["key"])
        else:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", var
            env[var["name"]] = POD_IP
    return env


def container_args(pod: Pod, container: dict) -> list[str]:
    env = container_env(pod, container)
    return [expand(arg, env) for arg in container.get("args", [])]


def containers() -> list[tuple[Pod, dict]]:
    return [(pod, c) for pod in pods() for c in pod.spec["containers"]]


def port_number(container: dict, port) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port] or [None]
    return number


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
