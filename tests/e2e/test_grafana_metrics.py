"""deploy/grafana's dashboard against real /metrics: after a completion on the shared server and one through a
`tinyvllm router` in front of it, every metric name in every PromQL expression of the dashboard (panels and
template variables) is one these scrapes expose, and every label it filters or groups by is one those series carry
once Prometheus scraped them (its target labels instance and job added; a scraped `instance` label, the router's,
renamed exported_instance)."""
from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.http_helpers import completion_body
from tests.e2e.server_process import REQUEST_TIMEOUT_S
from tests.helpers.grafana_dashboard import load, queries
from tests.router.router_process import RouterProcess

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", ""),
            "gauge": ("",), "info": ("_info",), "unknown": ("",)}
TARGET_LABELS = {"instance", "job"}  # what Prometheus adds to every scraped series


def scraped_names(url: str) -> dict[str, set[str] | None]:
    """{series name: its label names as stored by Prometheus, or None for a family with no sample yet}."""
    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    names: dict[str, set[str] | None] = {}
    labels = defaultdict(set)
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES[family.type]:
            names.setdefault(family.name + suffix, None)  # declared (a labelled counter before its first count)
        for sample in family.samples:
            labels[sample.name] |= {"exported_instance" if k == "instance" else k for k in sample.labels}
    for name, keys in labels.items():
        names[name] = keys | TARGET_LABELS
    return names


def complete(url: str) -> None:
    body = completion_body("The dashboard shows", max_tokens=4, temperature=0)
    r = httpx.post(url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S, trust_env=False)
    assert r.status_code == 200, r.text


def test_every_metric_and_label_the_dashboard_queries_is_scraped(server, tmp_path):
    complete(server.url)  # histograms, token counters and request_success get samples
    router = RouterProcess(tmp_path / "router.log", "--instances", server.url)
    try:
        router.wait_ready()
        complete(router.url)
        names = scraped_names(server.url) | scraped_names(router.url)
    finally:
        assert router.stop() == 0, router.log()[-3000:]
    assert names["vllm:time_to_first_token_seconds_count"] is not None
    missing, bad_labels, checked = [], [], 0
    for q in queries(load()):
        assert q.metrics, f"{q.where}: no metric in {q.expr}"
        for metric in q.metrics:
            checked += 1
            if metric not in names:
                missing.append(f"{q.where}: {metric}")
        known = [names[m] for m in q.metrics if names.get(m) is not None]
        if known:  # a label must be on at least one of the expression's series
            bad_labels += [f"{q.where}: {label}" for label in q.labels if not any(label in k for k in known)]
    assert not missing, "metrics the dashboard queries that /metrics lacks:\n" + "\n".join(missing)
    assert not bad_labels, "labels the dashboard uses that the series lack:\n" + "\n".join(bad_labels)
    assert checked > 40
