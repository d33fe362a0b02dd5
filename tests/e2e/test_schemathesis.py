"""Schemathesis against the real server's own /openapi.json: generated requests, valid ones and broken ones, to
every documented route never get a 5xx, and every answer matches the document (status code, content type, body).

The document is fetched from the running server, so it drives the test through schemathesis's Python API
(`openapi.from_dict` + each operation's Hypothesis strategy), one pytest subtest per operation and mode.
(`schemathesis.pytest.from_fixture` would be the natural fit, but with pytest 9.2 it fails on a node attribute
pytest no longer has.) Bounded: few examples per operation, and the copy of the document the test generates from
caps max_tokens and n (and requires max_tokens), so no valid request asks for a long generation. About 20 s on a
warm server; on a fresh one the first generations also pay tinygrad's one-time compile of each batch/chunk size.
"""
import copy

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

MAX_EXAMPLES = 15
GENERATION_CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "n": 2}
CHECKS = ["not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "response_headers_conformance"]
MODES = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]


def capped(document: dict) -> dict:
    """A copy of the document whose request schemas cap the generation-size fields at GENERATION_CAPS and
    require max_tokens."""
    doc = copy.deepcopy(document)

    def cap(node):
        if isinstance(node, dict):
            properties = node.get("properties")
            for name, limit in GENERATION_CAPS.items():
                field = properties.get(name) if isinstance(properties, dict) else None
                if isinstance(field, dict) and field.get("type") == "integer":
                    field["maximum"] = limit
            if isinstance(properties, dict) and "max_tokens" in properties:
                # chat's default is "the rest of the context": hundreds of tokens
                node["required"] = sorted({*node.get("required", []), "max_tokens"})
            for value in node.values():
                cap(value)
        elif isinstance(node, list):
            for value in node:
                cap(value)

    cap(doc)
    return doc


def load_schema(url: str):
    document = httpx.get(url + "/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(capped(document))
    schema.config.update(base_url=url, request_timeout=120)
    schema.config.checks.update(included_check_names=CHECKS)
    return document, schema


def run_operation(operation, mode) -> None:
    try:
        strategy = operation.as_strategy(generation_mode=mode)
    except Unsatisfiable:  # e.g. nothing to break in a GET without parameters
        return

    @given(case=strategy)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate, Phase.shrink])
    def check(case):
        case.call_and_validate()

    try:
        check()
    except Unsatisfiable:
        pass


def test_generated_requests_get_no_server_error_and_match_the_document(server, subtests):
    document, schema = load_schema(server.url)
    operations = [result.ok() for result in schema.get_all_operations()]
    documented = {(path, method.upper()) for path, methods in document["paths"].items() for method in methods}
    assert {(op.path, op.method.upper()) for op in operations} == documented
    for operation in operations:
        for mode in MODES:
            with subtests.test(msg=f"{operation.method.upper()} {operation.path} ({mode.value})"):
                run_operation(operation, mode)
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
def test_wrong_method_is_a_documented_405_with_allow(server, path):
    r = httpx.get(server.url + path, timeout=30)
    assert r.status_code == 405 and r.headers["allow"] == "POST", (r.status_code, r.headers)
    assert r.json()["error"]["code"] == 405
