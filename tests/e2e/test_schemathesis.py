"""Schemathesis against the real server's own /openapi.json: generated requests, valid ones and broken ones, to
every documented route never get a 5xx, and every answer matches the document (status code, content type, body).

The document is fetched from the running server, so it drives the test through schemathesis's Python API
(`openapi.from_dict` + each operation's Hypothesis strategy), one pytest subtest per operation and mode.
(`schemathesis.pytest.from_fixture` would be the natural fit, but with pytest 9.2 it fails on a node attribute
pytest no longer has.) Bounded: few examples per operation, and the copy of the document the test generates from
caps max_tokens, n and Ollama's num_predict (and requires them), so no valid request asks for a long generation;
its `model` fields mostly name the served model, so valid requests get past the model lookup
(tests/helpers/openapi_fuzz.py). About a minute on a warm server; on a fresh one the first generations also pay
tinygrad's one-time compile of each batch/chunk size.
"""
import httpx
import pytest
import schemathesis

from tests.e2e.server_process import MODEL_NAME
from tests.helpers.openapi_fuzz import CHECKS, MODES, capped, naming_the_served_model, run_operation

MAX_EXAMPLES = 15


def load_schema(url: str):
    document = httpx.get(url + "/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(capped(naming_the_served_model(document, MODEL_NAME)))
    schema.config.update(base_url=url, request_timeout=120)
    schema.config.checks.update(included_check_names=CHECKS)
    return document, schema


def test_generated_requests_get_no_server_error_and_match_the_document(server, subtests):
    document, schema = load_schema(server.url)
    operations = [result.ok() for result in schema.get_all_operations()]
    documented = {(path, method.upper()) for path, methods in document["paths"].items() for method in methods}
    assert {(op.path, op.method.upper()) for op in operations} == documented
    for operation in operations:
        for mode in MODES:
            with subtests.test(msg=f"{operation.method.upper()} {operation.path} ({mode.value})"):
                run_operation(operation, mode, MAX_EXAMPLES)
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
def test_wrong_method_is_a_documented_405_with_allow(server, path):
    r = httpx.get(server.url + path, timeout=30)
    assert r.status_code == 405 and r.headers["allow"] == "POST", (r.status_code, r.headers)
    assert r.json()["error"]["code"] == 405
