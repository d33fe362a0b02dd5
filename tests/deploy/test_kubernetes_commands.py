"""Each container of deploy/kubernetes runs a `tinyvllm` command its parser accepts, probes the port that command
listens on and routes it serves, gets its secrets from a Secret only, and has time to drain before SIGKILL."""
import re
import tomllib

from tests.deploy import cli_check, test_containerfile as containerfile
from tests.deploy.kube import REPO, port_number, sample_secret
from tinyvllm.frontend.api.server import ServerArgs
from tinyvllm.protocol.engine_config import EngineConfig

PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
SECRET_FLAGS = ("--api-key", "--worker-secret", "--register-secret", "--kv-secret")
SECRET_KEYS = {"api-key", "worker-secret", "router-secret", "kv-secret"}


def test_every_container_runs_the_images_entrypoint(started):
    for s in started:  # a `command` would replace tini and the entrypoint's mapping of the environment
        assert "command" not in s.container and s.container["args"][0] in ("serve", "worker", "router"), s.name


def test_every_container_runs_a_command_tinyvllm_accepts(started):
    for s in started:
        args = cli_check.parse(s.argv)
        assert args.command == s.argv[0], s.name
        if args.command == "serve":
            EngineConfig.from_namespace(args)


def test_every_probe_asks_the_commands_port_and_a_route_it_serves(started):
    served = cli_check.serve_get({p["httpGet"]["path"] for s in started if s.argv[0] == "serve"
                                  for p in (s.container.get(k) for k in PROBES) if p})
    probed = 0
    for s in started:
        args = cli_check.parse(s.argv)
        for kind in PROBES:
            if probe := s.container.get(kind):
                assert port_number(s.container, probe["httpGet"]["port"]) == args.port, (s.name, kind)
                path = probe["httpGet"]["path"]
                if args.command == "serve":
                    assert served[path][0] == 200, (s.name, kind, path, served[path])
                else:
                    assert path in cli_check.router_routes(), (s.name, kind, path)
                probed += 1
        if args.command in ("serve", "router"):
            assert port_number(s.container, "http") == args.port, s.name
    assert probed >= 8


def test_a_serve_container_gets_time_to_start_drops_out_while_unhealthy_and_restarts_when_hung(started):
    for s in (s for s in started if s.argv[0] == "serve"):
        startup, ready, live = (s.container[k] for k in PROBES)
        assert startup["periodSeconds"] * startup["failureThreshold"] >= ServerArgs().startup_timeout_s, s.name
        assert startup["httpGet"]["path"] == ready["httpGet"]["path"] == "/health", s.name
        # /health is 503 while the server restarts its engine itself: liveness must not kill it for that
        assert live["httpGet"]["path"] != "/health", s.name


def pre_stop_seconds(container: dict) -> int:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", ["sleep", "0"])
    assert command[0] == "sleep", command
    return int(command[1])


def test_the_grace_period_covers_the_drain(started):
    serves = [s for s in started if s.argv[0] == "serve"]
    assert serves
    for s in serves:
        grace = s.pod.spec["terminationGracePeriodSeconds"]
        drain = pre_stop_seconds(s.container) + cli_check.parse(s.argv).shutdown_timeout_s
        assert grace >= drain + 5, (s.name, grace, drain)
        for w in (w for w in started if w.pod.workload is s.pod.workload and w.argv[0] == "worker"):
            # a worker of the group outlives the leader's drain, which ends with a Shutdown to it
            assert drain <= pre_stop_seconds(w.container) < w.pod.spec["terminationGracePeriodSeconds"], w.name


def test_secrets_come_from_the_secret_and_never_reach_a_command_line(started):
    refs = set()
    for s in started:
        assert not any(arg.startswith(SECRET_FLAGS) for arg in s.container["args"] + s.argv), s.name
        for var in s.container.get("env", []):
            if re.search("SECRET|KEY", var["name"]):
                ref = var["valueFrom"]["secretKeyRef"]  # never a value written in the manifest
                refs.add((ref["name"], ref["key"]))
        secrets = [v for k, v in s.env.items() if v.startswith("secret-")]
        assert not any(secret in arg for secret in secrets for arg in s.argv), s.name
    assert refs == {("tinyvllm", key) for key in SECRET_KEYS}
    docs = (REPO / "docs" / "DEPLOY.md").read_text()
    (create,) = re.findall(r"kubectl create secret generic tinyvllm[^`]*?(?=\n```)", docs, re.S)
    assert set(re.findall(r"--from-literal=([a-z-]+)=", create)) == SECRET_KEYS
    assert sample_secret("tinyvllm", "api-key") not in docs


def test_engines_mount_shared_memory_for_the_all_reduce(started):
    for s in (s for s in started if s.argv[0] in ("serve", "worker")):
        args = cli_check.parse(s.argv)
        if args.command == "serve" and args.external_workers:
            continue  # its workers are other containers
        volumes = {v["name"]: v for v in s.pod.spec["volumes"]}
        (shm,) = [m for m in s.container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        assert volumes[shm["name"]]["emptyDir"]["medium"] == "Memory", s.name


def test_images_are_this_versions_and_pods_run_as_its_user(started):
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    uid = int(re.search(r"useradd --uid (\d+)", (REPO / "Containerfile").read_text()).group(1))
    for s in started:
        assert s.container["image"] in (f"tinyvllm:{version}", f"tinyvllm:{version}-cuda"), s.name
        security = s.pod.spec["securityContext"]
        assert security["runAsNonRoot"] and security["runAsUser"] == uid, s.name
        assert s.container["securityContext"]["allowPrivilegeEscalation"] is False, s.name


def test_the_image_exposes_every_port_the_manifests_open(started):
    exposed = {int(p) for rest in containerfile.of("EXPOSE") for p in rest.split()}
    opened = {port["containerPort"] for s in started for port in s.container.get("ports", [])}
    assert opened and opened <= exposed
