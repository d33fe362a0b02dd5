"""A fast schemathesis pass over the in-process app (fake engine): no generated request, valid or broken, to any
documented route gets a 5xx, and every answer matches /openapi.json. tests/e2e/test_schemathesis.py does the same
against the real server. Request `model` fields mostly name the served model, so valid requests reach the engine
(tests/helpers/openapi_fuzz.py)."""
import asyncio

import schemathesis

from app_harness import MODEL, client_for
from ollama_harness import build_ollama_app
from tests.helpers.openapi_fuzz import CHECKS, MODES, naming_the_served_model, run_operation

MAX_EXAMPLES = 10


async def served_document(app) -> dict:
    return (await client_for(app).get("/openapi.json")).json()


def test_generated_requests_against_the_app(subtests, tmp_path):
    app, _, _ = build_ollama_app(tmp_path)  # with a models folder: /api/create, /api/copy, blobs, ... write there
    document = asyncio.run(served_document(app))
    # copying the served model is fine here (the folder is the test's own); the e2e test leaves `source` alone
    schema = schemathesis.openapi.from_dict(naming_the_served_model(document, MODEL, ("model", "source")))
    schema.app = app
    schema.config.checks.update(included_check_names=CHECKS)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {(op.path, op.method.upper()) for op in operations} == {
        (path, method.upper()) for path, methods in document["paths"].items() for method in methods}
    for operation in operations:
        for mode in MODES:
            with subtests.test(msg=f"{operation.method.upper()} {operation.path} ({mode.value})"):
                run_operation(operation, mode, MAX_EXAMPLES)
