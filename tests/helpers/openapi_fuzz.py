"""Schemathesis over our own /openapi.json, shared by tests/frontend/test_openapi_schemathesis.py (in-process app)
and tests/e2e/test_schemathesis.py (a real server): the checks, one Hypothesis run per operation and mode, and
a copy of the document whose `model` fields mostly name the served model, so that valid requests get past the
model lookup (a random name is a 404 before anything else runs) and reach generation, embedding and the rest,
and a copy whose generation-size fields are capped, so that no valid request asks for a long generation. Also used
by benchmarks/chaos.py, which sends cases generated for a whole run (generate_until).
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import queue
import random
import threading

import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
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


def generate_until(stop: threading.Event, schema, cases: queue.Queue, rng: random.Random, per_run: int = 20) -> None:
    """Puts generated cases of every operation and mode into `cases`, `per_run` of one (operation, mode) at a time,
    in turn, until `stop` is set; it waits while the queue is full, so cases are made as fast as they are taken."""
    strategies = []
    for operation, mode in itertools.product((result.ok() for result in schema.get_all_operations()), MODES):
        with contextlib.suppress(Unsatisfiable):  # e.g. nothing to break in a GET without parameters
            strategies.append(operation.as_strategy(generation_mode=mode))
    while strategies and not stop.is_set():
        for strategy in list(strategies):
            @given(case=strategy)
            @settings(max_examples=per_run, deadline=None, database=None, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))
            def put(case):
                while not stop.is_set():
                    with contextlib.suppress(queue.Full):
                        return cases.put(case, timeout=1)
            try:
                seed(rng.getrandbits(64))(put)()  # a seed of our own: a new run, and no "reproduce with" notice
            except Unsatisfiable:
                strategies.remove(strategy)


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


# The generation-size fields: capped, and required where leaving them out means "until the context ends".
GENERATION_CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "n": 2, "num_predict": 4}


def capped(document: dict, caps: dict[str, int] = GENERATION_CAPS) -> dict:
    """A copy of the document whose request schemas cap the generation-size fields at `caps` and
    require max_tokens (chat's default is the rest of the context) and Ollama's options.num_predict (whose
    default, -1, is too; 0 or less means the same, so it must be at least 1)."""
    doc = copy.deepcopy(document)

    def cap(node):
        if isinstance(node, dict):
            properties = node.get("properties")
            for name, limit in caps.items():
                field = properties.get(name) if isinstance(properties, dict) else None
                if isinstance(field, dict) and field.get("type") == "integer":
                    field["maximum"] = limit
                    field["minimum"] = max(field.get("minimum", 1), 1)
            if isinstance(properties, dict):
                required = {name for name in ("max_tokens", "num_predict") if name in properties}
                options = properties.get("options")
                if isinstance(options, dict) and "num_predict" in options.get("properties", {}):
                    required.add("options")
                if required:
                    node["required"] = sorted({*node.get("required", []), *required})
            for value in node.values():
                cap(value)
        elif isinstance(node, list):
            for value in node:
                cap(value)

    cap(doc)
    return doc
