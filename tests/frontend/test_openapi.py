"""/openapi.json: built from the app's own route list, so every route appears; routes describe themselves with
openapi.describe(); the OpenAI routes document their request and response schemas and the error shape."""
import pytest
import schemathesis
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from app_harness import MODEL, client_for, make_app
from tinyvllm.frontend import openai_protocol as api
from tinyvllm.frontend import openai_schemas, openapi
from tinyvllm.frontend.ollama import schemas as ollama_schemas
from tinyvllm.frontend.ollama.options import (IGNORED_OPTIONS, OTHER_OPTIONS, SAMPLER_OPTIONS, OptionError, generation_settings,
                                     option_type)
from tinyvllm.protocol.sampling import MAX_LOGPROBS, MAX_N

pytestmark = pytest.mark.anyio


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


async def test_every_route_is_described():
    app, _, _ = make_app()
    doc = await document(app)
    undescribed = [(path, method) for path, methods in doc["paths"].items() for method, op in methods.items()
                   if "default" in op["responses"]]
    assert not undescribed
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            for status, response in op["responses"].items():
                if path.startswith("/api/") and status.startswith(("4", "5")) and "content" in response:
                    assert response["content"]["application/json"]["schema"] == openapi.OLLAMA_ERROR_SCHEMA, path


async def test_the_embeddings_route_documents_its_body():
    app, _, _ = make_app()
    op = (await document(app))["paths"]["/v1/embeddings"]["post"]
    request = op["requestBody"]["content"]["application/json"]["schema"]
    assert request == openai_schemas.EMBEDDING_REQUEST and request["required"] == ["input"]
    assert set(request["properties"]) == {"model", "input", "encoding_format", "dimensions", "user"}
    assert request["properties"]["encoding_format"]["enum"] == ["float", "base64"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == openai_schemas.EMBEDDING_RESPONSE
    client = client_for(app)
    for body in [{"input": "hi"}, {"input": ["a", "b"]}, {"input": [1, 2]}, {"input": [[1], "b"]},
                 {"input": "hi", "encoding_format": "base64", "dimensions": None, "user": "u", "model": MODEL}]:
        assert (await client.post("/v1/embeddings", json=body)).status_code == 200, body
    for body in [{"input": ""}, {"input": []}, {"input": [[]]}, {"input": "hi", "dimensions": 4},
                 {"input": "hi", "encoding_format": "int8"}]:
        assert (await client.post("/v1/embeddings", json=body)).status_code == 400, body


SAMPLING_BOUNDS = {  # field: (minimum, maximum, exclusive minimum), as the parser enforces them
    "top_k": (-1, 2**31 - 1, None), "n": (1, MAX_N, None), "best_of": (1, MAX_N, None),
    "seed": (-(2**63), 2**63 - 1, None), "min_p": (0, 1, None), "presence_penalty": (-2, 2, None),
    "frequency_penalty": (-2, 2, None), "repetition_penalty": (None, None, 0), "min_tokens": (0, None, None),
    "temperature": (0, None, None), "top_p": (None, 1, 0), "max_tokens": (1, None, None),
}


@pytest.mark.parametrize("is_chat", [False, True])
def test_sampling_fields_are_documented_with_the_parsers_bounds(is_chat):
    schema = openai_schemas.CHAT_REQUEST if is_chat else openai_schemas.COMPLETION_REQUEST
    properties = schema["properties"]
    bounds = {**SAMPLING_BOUNDS, **({"max_completion_tokens": (1, None, None), "top_logprobs": (0, MAX_LOGPROBS, None)}
                                    if is_chat else {"logprobs": (0, MAX_LOGPROBS, None)})}
    for name, (low, high, low_exclusive) in bounds.items():
        field = properties[name]
        assert (field.get("minimum"), field.get("maximum"), field.get("exclusiveMinimum")) == (low, high,
                                                                                             low_exclusive), name
    for name in ("logit_bias", "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "echo",
                 "stream_options", "skip_special_tokens"):
        assert name in properties, name
    assert properties["logprobs"]["type"] == ("boolean" if is_chat else "integer")
    assert properties["logit_bias"]["additionalProperties"] == {"type": "number"}
    assert "stream_options" in schema["dependentSchemas"]


@pytest.mark.parametrize("is_chat", [False, True])
def test_the_documented_bounds_are_exactly_the_parsers(is_chat):
    """At each documented bound the parser accepts; one step past it, it refuses (a 400, never a 500)."""
    schema = openai_schemas.CHAT_REQUEST if is_chat else openai_schemas.COMPLETION_REQUEST
    base = {"messages": [{"role": "user", "content": "hi"}]} if is_chat else {"prompt": "hi"}
    parse = api.parse_chat_request if is_chat else api.parse_completion_request
    needs = {"top_logprobs": {"logprobs": True}, "min_tokens": {"max_tokens": 2**40}, "best_of": {"n": None}}
    for name, field in schema["properties"].items():
        if field.get("type") not in ("integer", "number"):
            continue
        step = 1 if field["type"] == "integer" else 1e-6
        body = {**base, **needs.get(name, {})}

        def with_value(value):
            return {**body, name: value, **({"n": value} if name == "best_of" else {})}

        for key, inside, outside in [("minimum", 0, -step), ("maximum", 0, step), ("exclusiveMinimum", step, 0)]:
            if key in field:
                parse(with_value(field[key] + inside))
                with pytest.raises(api.APIError):
                    parse(with_value(field[key] + outside))


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "presence_penalty", "repetition_penalty"])
def test_a_number_too_large_for_a_float_is_a_400(name):
    with pytest.raises(api.APIError, match="finite"):
        api.parse_completion_request({"prompt": "hi", name: 10**400})
    with pytest.raises(api.APIError, match="finite"):
        api.parse_completion_request({"prompt": "hi", "logit_bias": {"1": 10**400}})
    with pytest.raises(OptionError, match="finite"):
        generation_settings({}, {name.replace("repetition", "repeat"): 10**400})


def test_ollama_options_are_documented_with_their_types():
    documented = ollama_schemas.OPTIONS["properties"]
    json_types = {int: "integer", float: "number", bool: "boolean"}
    for name, field in documented.items():
        kind = option_type(name)
        assert kind is not None, name
        if kind is not list:
            assert field["type"] == json_types[kind], name
    assert set(documented) == {*SAMPLER_OPTIONS, *OTHER_OPTIONS, *IGNORED_OPTIONS}
