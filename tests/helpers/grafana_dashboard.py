"""deploy/grafana/tinyvllm-dashboard.json, read for tests: every PromQL expression in it (panel targets and the
template variables' queries) and the metric and label names each one uses, parsed well enough for the queries a
dashboard holds (no subqueries with nested label lists in strings, no @ modifiers)."""
from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass, field

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy/grafana/tinyvllm-dashboard.json"
PROMETHEUS_CONFIG = REPO / "deploy/grafana/prometheus.yml"

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
            "inf", "nan"}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"')
_TOKEN = re.compile(r"(?:\d+(?:ms|[smhdwy]))+\b|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


@dataclass
class Query:
    where: str  # the panel or variable it belongs to
    expr: str
    metrics: set[str] = field(default_factory=set)
    labels: set[str] = field(default_factory=set)  # in matchers, by (...) and the like, label_values' label


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict) -> list[dict]:
    """Every panel, those nested in collapsed rows too."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def parse(where: str, expr: str) -> Query:
    q = Query(where, expr)
    text = expr
    if m := _LABEL_VALUES.match(text):  # a Grafana variable query: label_values(selector, label)
        text = m.group(1)
        q.labels.add(m.group(2))
    text = re.sub(r"\$\{[^}]*\}|\$[A-Za-z_]\w*", "", text)  # $__rate_interval, ${var}
    for m in _MATCHER.finditer(text):
        q.labels.add(m.group(1))
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # range selectors
    text = re.sub(r'"(?:[^"\\]|\\.)*"', " ", text)  # strings (label_replace's arguments)
    for m in _GROUPING.finditer(text):
        q.labels.update(label.strip() for label in m.group(2).split(",") if label.strip())
    text = _GROUPING.sub(" ", text)
    for m in _TOKEN.finditer(text):
        name, call = m.group(1), m.group(2)
        if name and not call and name not in KEYWORDS:  # a function or aggregation is followed by "("
            q.metrics.add(name)
    return q


def queries(dashboard: dict) -> list[Query]:
    out = []
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            out.append(parse(f"panel {panel['id']} {panel['title']!r} {target.get('refId')}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append(parse(f"variable {var['name']}", query))
    return out
