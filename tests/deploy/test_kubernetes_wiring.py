"""How the manifests of deploy/kubernetes meet: a LeaderWorkerSet group holds every rank once and its workers reach
its scheduler; Services select pods that have their ports; the routers (two replicas) discover the engines of each role
through its headless Service, with no registration; Prometheus scrapes the engines' /metrics; KEDA scales a Deployment on a metric
the engines export; the inference gateway's pool selects the engines on the port they serve, its route sends to the
pool, and the endpoint picker finds the metrics it reads in their /metrics."""
import re
from urllib.parse import urlsplit

from tests.deploy import cli_check
from tests.deploy.kube import POD_IP, find, objects, port_number, pods, selects


def by_kind(kind: str) -> list[dict]:
    return [doc for _, doc in objects() if doc["kind"] == kind]


def commands_of(started, workload) -> list:
    return [(s, cli_check.parse(s.argv)) for s in started if s.pod.workload is workload]


def test_a_leaderworkerset_group_runs_every_rank_once_around_one_scheduler(started):
    (group,) = by_kind("LeaderWorkerSet")
    template = group["spec"]["leaderWorkerTemplate"]
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"  # the scheduler's membership is fixed
    assert group["spec"]["startupPolicy"] == "LeaderCreated"  # its leader is ready only once the workers joined
    commands = commands_of(started, group)
    (serve,) = [args for _, args in commands if args.command == "serve"]
    workers = [(s, args) for s, args in commands if args.command == "worker"]
    tp, pp = serve.tensor_parallel_size, serve.pipeline_parallel_size
    assert serve.external_workers and template["size"] == pp  # one pod per pipeline stage
    assert sorted(args.rank for _, args in workers) == list(range(tp * pp))
    scheduler_port = urlsplit(serve.worker_address).port
    for s, args in workers:
        assert (args.tensor_parallel_size, args.pipeline_parallel_size, args.model) == (tp, pp, serve.model), s.name
        stage = int(s.pod.injected["LWS_WORKER_INDEX"])
        assert args.rank // tp == stage, s.name  # a stage's tensor-parallel ranks share a pod (shared memory)
        leader = "127.0.0.1" if stage == 0 else s.pod.injected["LWS_LEADER_ADDRESS"]
        assert args.connect == f"tcp://{leader}:{scheduler_port}", s.name
        mounts = {m["mountPath"]: m["name"] for m in s.container["volumeMounts"]}
        volumes = {v["name"]: v for v in s.pod.spec["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], s.name  # the ranks' named pipes, in one shared /tmp
    (leader_serve,) = [s for s, args in commands if args.command == "serve"]
    assert port_number(leader_serve.container, "workers") == scheduler_port


def test_every_service_selects_pods_that_have_its_ports():
    for service in by_kind("Service"):
        selected = [pod for pod in pods() if selects(service["spec"]["selector"], {**pod.labels, **_lws_labels(pod)})]
        assert selected, service["metadata"]["name"]
        for pod in selected:
            for port in service["spec"]["ports"]:
                assert any(port_number(c, port["targetPort"]) for c in pod.spec["containers"]), (
                    service["metadata"]["name"], port)


def _lws_labels(pod) -> dict:
    """The labels LeaderWorkerSet puts on its pods."""
    if not pod.injected:
        return {}
    return {"leaderworkerset.sigs.k8s.io/name": pod.workload["metadata"]["name"],
            "leaderworkerset.sigs.k8s.io/worker-index": pod.injected["LWS_WORKER_INDEX"]}


def test_the_routers_discover_every_role_through_its_headless_service_and_nothing_registers(started):
    (router,) = [cli_check.parse(s.argv) for s in started if s.argv[0] == "router"]
    assert find("Deployment", "tinyvllm-router")["spec"]["replicas"] >= 2  # no state a replica lacks
    targets = {"both": router.discover_dns, "prefill": router.discover_prefill_dns, "decode": router.discover_decode_dns}
    for role, target in targets.items():
        host, port = target.rsplit(":", 1)
        port = int(port)
        service = find("Service", host)
        assert service["spec"]["clusterIP"] == "None"  # headless: its name resolves to the pods, not one virtual IP
        assert [p["port"] for p in service["spec"]["ports"]] == [port]
        serving = [s for s in started if s.argv[0] == "serve" and selects(service["spec"]["selector"], s.pod.labels)]
        assert serving, role
        for s in serving:
            args = cli_check.parse(s.argv)
            assert (args.role, args.port, s.pod.labels["tinyvllm/role"]) == (role, port, role), s.name
    assert find("Service", "tinyvllm-router")["spec"]["ports"][0]["port"] == router.port
    assert not [s.name for s in started if "--register-with" in s.argv]  # found by DNS, so any router finds them


def test_prometheus_scrapes_every_engine_on_a_route_it_serves(started):
    (monitor,) = by_kind("PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    serving = {id(s.pod.template) for s in started if s.argv[0] == "serve"}
    assert {id(pod.template) for pod in pods() if selects(selector, pod.labels)} == serving
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert cli_check.serve_get({endpoint["path"]})[endpoint["path"]][0] == 200
    for s in (s for s in started if s.argv[0] == "serve"):
        assert port_number(s.container, endpoint["port"]) == cli_check.parse(s.argv).port, s.name
        assert all(label in s.pod.labels for label in monitor["spec"]["podTargetLabels"]), s.name


def test_keda_scales_a_deployment_on_a_metric_its_engines_export():
    (scaled,) = by_kind("ScaledObject")
    target = scaled["spec"]["scaleTargetRef"]
    deployment = find(target["kind"], target["name"])
    assert scaled["spec"]["minReplicaCount"] >= 1  # a cold start takes minutes
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    metric, matchers = re.fullmatch(r"sum\(([a-z_:]+)\{(.*)\}\)", trigger["metadata"]["query"]).groups()
    status, text = cli_check.serve_get({"/metrics"})["/metrics"]
    assert status == 200 and re.search(rf"^{re.escape(metric)}\{{", text, re.M), metric
    (monitor,) = by_kind("PodMonitor")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for label, value in re.findall(r'([a-z_]+)="([^"]*)"', matchers):  # a pod label the PodMonitor copies
        (source,) = [k for k in monitor["spec"]["podTargetLabels"] if re.sub(r"[^a-zA-Z0-9_]", "_", k) == label]
        assert pod_labels[source] == value, label


# What the Gateway API Inference Extension's endpoint picker scrapes from a vLLM-compatible server (its
# model-server protocol, docs/proposals/003-model-server-protocol: queued and running requests, KV-cache
# utilisation, and vllm:cache_config_info's block size and block count for its prefix-cache scorer): vLLM's names,
# the picker's defaults.
EPP_METRICS = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
               "vllm:cache_config_info")


def test_the_inference_pool_selects_the_engines_on_their_port_and_the_route_sends_to_it(started):
    (pool,) = by_kind("InferencePool")
    selector = pool["spec"]["selector"]["matchLabels"]
    engines = find("Deployment", "tinyvllm")
    assert selects(selector, engines["spec"]["template"]["metadata"]["labels"])
    assert not selects(selector, find("Deployment", "tinyvllm-router")["spec"]["template"]["metadata"]["labels"])
    ((port,),) = [[p["number"] for p in pool["spec"]["targetPorts"]]]
    serving = [s for s in started if s.pod.workload is engines]
    assert serving and all(cli_check.parse(s.argv).port == port for s in serving)
    (route,) = by_kind("HTTPRoute")
    ((backend,),) = [rule["backendRefs"] for rule in route["spec"]["rules"]]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        pool["apiVersion"].split("/")[0], "InferencePool", pool["metadata"]["name"])
    status, text = cli_check.serve_get({"/metrics"})["/metrics"]
    assert status == 200
    for metric in EPP_METRICS:
        assert re.search(rf"^{re.escape(metric)}(\{{| )", text, re.M), metric
