"""Schemathesis over our own /openapi.json, shared by tests/frontend/test_openapi_schemathesis.py (in-process app)
and tests/e2e/test_schemathesis.py (a real server): the checks, one Hypothesis run per operation and mode, and
a copy of the document whose `model` fields mostly name the served model, so that valid requests get past the
model lookup (a random name is a 404 before anything else runs) and reach generation, embedding and the rest.
"""
from __future__ import annotations

import copy

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

CHECKS = ["not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "response_headers_conformance"]
MODES = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]


def run_operation(operation, mode, max_examples: int) -> None:
    try:
        strategy = operation.as_strategy(generation_mode=mode)
    except Unsatisfiable:  # e.g. nothing to break in a GET without parameters
        return

    @given(case=strategy)
    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate, Phase.shrink])
    def check(case):
        case.call_and_validate()

    try:
        check()
    except Unsatisfiable:
        pass


def request_schemas(document: dict):
    """Every JSON request body schema in the document (the objects themselves, to edit in place)."""
    for methods in document["paths"].values():
        for op in methods.values():
            schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if schema is not None:
                yield schema


def _objects(node):
    """node and every schema object nested in it."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from _objects(value)


def naming_the_served_model(document: dict, model_name: str, fields: tuple[str, ...] = ("model",)) -> dict:
    """A copy of the document where a valid request's `model` field (and any other of `fields`) is the served
    model, most of the time.

    An enum, because `anyOf: [{const: name}, {type: string}]` never yields the name: the generator folds the const
    into the string. Negative requests still get other values there."""
    doc = copy.deepcopy(document)
    for schema in request_schemas(doc):
        for node in _objects(schema):
            properties = node.get("properties")
            for name in fields:
                if isinstance(properties, dict) and isinstance(properties.get(name), dict):
                    properties[name] = {"type": "string", "enum": [model_name, model_name, "no-such-model"]}
    return doc
