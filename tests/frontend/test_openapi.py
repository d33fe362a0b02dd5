"""/openapi.json: built from the app's own route list, so every route appears; routes describe themselves with
openapi.describe(); the OpenAI routes document their request and response schemas and the error shape."""
import pytest
import schemathesis
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from app_harness import client_for, make_app
from frontend import openai_protocol as api
from frontend import openai_schemas, openapi

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def document(app) -> dict:
    r = await client_for(app).get("/openapi.json")
    assert r.status_code == 200
    return r.json()


async def test_every_route_of_the_app_is_documented():
    app, _, _ = make_app()
    doc = await document(app)
    routes = openapi.app_operations(app.routes)
    documented = {(path, method.upper()) for path, methods in doc["paths"].items() for method in methods}
    assert set(routes) == documented
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize", "/version",
                 "/health", "/metrics", "/openapi.json"):
        assert path in doc["paths"], path


async def test_routes_added_later_and_mounted_routes_appear():
    app, _, _ = make_app()

    async def hello(request):
        return PlainTextResponse("hi")

    app.router.routes.append(Mount("/extra", routes=[Route("/items/{item_id:int}", hello, methods=["GET", "DELETE"]),
                                                     Mount("/deeper", routes=[Route("/leaf", hello)])]))
    doc = await document(app)
    item = doc["paths"]["/extra/items/{item_id}"]
    assert set(item) == {"get", "delete"}  # HEAD, which Starlette adds to every GET, is left out
    assert item["get"]["parameters"] == [{"name": "item_id", "in": "path", "required": True,
                                          "schema": {"type": "string"}}]
    assert item["get"]["responses"] == {"default": {"description": "Not described"}}
    assert "get" in doc["paths"]["/extra/deeper/leaf"]


async def test_describe_registers_a_routes_schemas():
    async def echo(request):
        return PlainTextResponse("{}")

    request_schema = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
    openapi.describe("/test-only/echo", "post", request_schema, {"type": "object"}, summary="Echo",
                     stream_media_type="application/x-ndjson", error_statuses=(400, 404),
                     error_schema=openapi.OLLAMA_ERROR_SCHEMA)
    app = Starlette(routes=[Route("/test-only/echo", echo, methods=["POST"])])
    op = openapi.build_document(app.routes, title="t", version="0", api_key_required=False)["paths"][
        "/test-only/echo"]["post"]
    assert op["summary"] == "Echo"
    assert op["requestBody"] == {"required": True, "content": {"application/json": {"schema": request_schema}}}
    assert op["responses"]["200"]["content"] == {"application/json": {"schema": {"type": "object"}},
                                                 "application/x-ndjson": {}}
    assert op["responses"]["404"]["content"]["application/json"]["schema"] == openapi.OLLAMA_ERROR_SCHEMA
    assert set(op["responses"]) == {"200", "400", "404"}


async def test_openai_routes_document_bodies_streams_and_errors():
    app, _, _ = make_app()
    paths = (await document(app))["paths"]
    for path, request_schema, response_schema in [
        ("/v1/completions", openai_schemas.COMPLETION_REQUEST, openai_schemas.COMPLETION_RESPONSE),
        ("/v1/chat/completions", openai_schemas.CHAT_REQUEST, openai_schemas.CHAT_RESPONSE),
    ]:
        op = paths[path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"] == request_schema
        ok = op["responses"]["200"]["content"]
        assert ok["application/json"]["schema"] == response_schema
        assert ok["text/event-stream"]["schema"] == openapi.SSE_EVENT_SCHEMA
        for status in ("400", "404", "413", "500", "503"):
            assert op["responses"][status]["content"]["application/json"]["schema"] == openapi.ERROR_SCHEMA
        assert "security" not in op  # no API key configured


def test_the_document_loads_in_schemathesis():
    app, _, _ = make_app()
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    results = list(schema.get_all_operations())
    assert results and all(r.ok() for r in results)


def example(field: dict):
    if "oneOf" in field:
        return example(field["oneOf"][0])
    return {"integer": field.get("minimum", 1) if field.get("minimum", 1) >= 0 else 1, "number": 0.5,
            "boolean": True, "string": "x", "array": [], "object": {}}[field["type"]]


@pytest.mark.parametrize("is_chat", [False, True])
def test_every_documented_request_field_is_accepted_by_the_parser(is_chat):
    schema = openai_schemas.CHAT_REQUEST if is_chat else openai_schemas.COMPLETION_REQUEST
    base = {"messages": [{"role": "user", "content": "hi"}]} if is_chat else {"prompt": "hi"}
    parse = api.parse_chat_request if is_chat else api.parse_completion_request
    for name, field in schema["properties"].items():
        if name in base:
            continue
        body = {**base, name: example(field)}
        if name == "stream_options":
            body["stream"] = True
        parse(body)  # raises APIError on a field the parser refuses
