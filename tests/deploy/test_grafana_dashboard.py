"""deploy/grafana without Grafana or Prometheus: the dashboard has the structure Grafana's dashboard schema asks
for, every panel queries our Prometheus datasource variable with PromQL that names metrics (which metrics exist is
checked against a real server's /metrics in tests/e2e/test_grafana_metrics.py), and the Prometheus configurations
parse and scrape what deploy/kubernetes annotates."""
import re

import yaml

from tests.deploy.kube import pods, port_number
from tests.helpers.grafana_dashboard import DASHBOARD, PROMETHEUS_CONFIG, all_panels, load, queries

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
PANEL_TYPES = {"row", "timeseries", "heatmap", "stat", "gauge", "bargauge", "table"}


def test_the_dashboard_has_grafanas_top_level_structure():
    d = load()
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36  # panels with datasource objects
    assert d["title"] and re.fullmatch(r"[A-Za-z0-9_-]{1,40}", d["uid"])  # Grafana's uid limit
    assert "id" not in d or d["id"] is None  # an import must not overwrite another dashboard by id
    assert isinstance(d["panels"], list) and d["panels"]
    assert isinstance(d["templating"]["list"], list)
    assert {"from", "to"} <= d["time"].keys()


def test_the_template_variables():
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("model_name", "instance"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"] == DATASOURCE and v["multi"] and v["includeAll"], name
        assert v["allValue"] == ".*", name  # "All" must match every value in a =~ matcher
        assert re.search(rf",\s*{name}\)$", v["query"]["query"]), name
    assert "$model_name" in variables["instance"]["query"]["query"]  # instances of the chosen models


def test_every_panel_has_a_unique_id_a_place_on_the_grid_and_a_query():
    panels = all_panels(load())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells = set()
    for p in panels:
        assert p["type"] in PANEL_TYPES, p["title"]
        pos = p["gridPos"]
        assert {"h", "w", "x", "y"} == pos.keys() and pos["w"] > 0 and pos["h"] > 0, p["title"]
        assert pos["x"] + pos["w"] <= 24, p["title"]  # Grafana's grid is 24 columns wide
        area = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert not cells & area, f"{p['title']} overlaps another panel"
        cells |= area
        if p["type"] == "row":
            continue
        assert p["datasource"] == DATASOURCE, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE and t["expr"].strip(), p["title"]


def test_every_datasource_reference_is_the_variable():
    text = DASHBOARD.read_text()
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', text)) - {load()["uid"]}
    assert uids <= {"${DS_PROMETHEUS}", "-- Grafana --"}, uids  # -- Grafana --: the built-in annotations


def test_the_dashboard_has_the_panels_an_operator_looks_for():
    exprs = " ".join(q.expr for q in queries(load()))
    for metric in ("vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                   "vllm:e2e_request_latency_seconds_bucket", "vllm:prompt_tokens_total",
                   "vllm:generation_tokens_total", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
                   "vllm:num_requests_waiting", "vllm:num_preemptions_total", "vllm:prefix_cache_hits_total",
                   "vllm:spec_decode_num_accepted_tokens_total", "tinyvllm_router:requests_total"):
        assert metric in exprs, metric
    panels = all_panels(load())
    heatmaps = [p for p in panels if p["type"] == "heatmap"]
    for metric in ("time_to_first_token", "inter_token_latency", "e2e_request_latency"):
        (heatmap,) = [p for p in heatmaps if metric in p["targets"][0]["expr"]]
        (target,) = heatmap["targets"]
        assert target["format"] == "heatmap" and target["legendFormat"] == "{{le}}"
        assert heatmap["options"]["calculate"] is False  # Prometheus' buckets, not Grafana's own
        quantiles = [t["expr"] for p in panels if p["type"] == "timeseries" for t in p["targets"]
                     if metric in t["expr"] and "histogram_quantile" in t["expr"]]
        assert {re.search(r"histogram_quantile\(([0-9.]+)", e).group(1) for e in quantiles} >= {"0.5", "0.9", "0.99"}
    for q in queries(load()):
        if "histogram_quantile" in q.expr:
            assert re.search(r"by \([^)]*\ble\b", q.expr) and "_bucket" in q.expr, q.where
        if q.where.startswith("panel") and not any(m.startswith("tinyvllm_router:") for m in q.metrics):
            for metric in q.metrics:  # every selector of a server's metric follows both variables
                for m in re.finditer(re.escape(metric) + r"(?![\w:])(\{[^{}]*\})?", q.expr):
                    assert m.group(1) and 'model_name=~"$model_name"' in m.group(1) \
                        and 'instance=~"$instance"' in m.group(1), f"{q.where}: {metric}"


def test_the_parser_finds_metrics_and_labels_not_functions():
    from tests.helpers.grafana_dashboard import parse
    q = parse("x", 'histogram_quantile(0.9, sum by (le, instance) (rate(a:b_bucket{model_name=~"$m"}'
                   '[$__rate_interval]))) / on (instance) group_left 1 + c_total offset 5m')
    assert q.metrics == {"a:b_bucket", "c_total"} and q.labels == {"le", "instance", "model_name"}


def test_the_prometheus_configs_parse_and_scrape_metrics():
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"tinyvllm", "tinyvllm-router"}
    for job in jobs.values():
        assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"]
        assert all(re.fullmatch(r"[\w.-]+:\d+", t) for t in job["static_configs"][0]["targets"])
    kube = yaml.safe_load(PROMETHEUS_CONFIG.with_name("prometheus-kubernetes.yml").read_text())
    (job,) = kube["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    keep = job["relabel_configs"][0]
    assert keep["action"] == "keep" and keep["regex"] == "true"
    assert keep["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]


def test_kubernetes_annotates_every_pod_serving_http_for_the_scrape():
    """Every pod that runs `serve` or `router` carries prometheus.io/* annotations naming its HTTP port, and no
    other pod (the LeaderWorkerSet's workers have no /metrics)."""
    for pod in pods():
        annotations = pod.template["metadata"].get("annotations", {})
        (container,) = pod.spec["containers"][:1]
        serves_http = port_number(container, "http") is not None
        assert (annotations.get("prometheus.io/scrape") == "true") == serves_http, pod.path
        if serves_http:
            assert int(annotations["prometheus.io/port"]) == port_number(container, "http"), pod.path
            assert annotations["prometheus.io/path"] == "/metrics", pod.path
