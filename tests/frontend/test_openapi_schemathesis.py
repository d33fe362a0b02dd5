"""A fast schemathesis pass over the in-process app (fake engine): no generated request, valid or broken, to any
documented route gets a 5xx, and every answer matches /openapi.json. tests/e2e/test_schemathesis.py does the same
against the real server."""
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from app_harness import make_app

CHECKS = ["not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "response_headers_conformance"]


def run_operation(operation, mode) -> None:
    try:
        strategy = operation.as_strategy(generation_mode=mode)
    except Unsatisfiable:  # nothing to break in a GET without parameters
        return

    @given(case=strategy)
    @settings(max_examples=10, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate, Phase.shrink])
    def check(case):
        case.call_and_validate()

    try:
        check()
    except Unsatisfiable:
        pass


def test_generated_requests_against_the_app(subtests):
    app, _, _ = make_app()
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    schema.config.checks.update(included_check_names=CHECKS)
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            with subtests.test(msg=f"{operation.method.upper()} {operation.path} ({mode.value})"):
                run_operation(operation, mode)
