"""/openapi.json: built from the app's own route list, so every route appears; routes describe themselves with
openapi.describe() and the pydantic models of their bodies, so a request schema is the model that validates the
route's requests (the tests below check that every documented field is accepted and every documented bound is the
one enforced); the responses and the error shape are documented too."""
import pytest
import schemathesis
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from app_harness import MODEL, client_for, make_app
from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api import openapi
from tinyvllm.frontend.api.ollama.options import OllamaOptions, OptionError, check_options, generation_settings
from tinyvllm.frontend.api.openai_requests import ChatRequest, CompletionRequest, EmbeddingRequest
from tinyvllm.frontend.api.openai_responses import ChatResponse, CompletionResponse, EmbeddingResponse
from tinyvllm.frontend.api.request_models import json_schema
from tinyvllm.protocol.sampling import MAX_LOGPROBS, MAX_N

pytestmark = pytest.mark.anyio


async def document(app) -> dict:
    r = await client_for(app).get("/openapi.json")
    assert r.status_code == 200
    return r.json()


def request_schema(doc: dict, path: str, method: str = "post") -> dict:
    return doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]


def resolved(doc: dict, schema: dict) -> dict:
    """A schema, or the components/schemas entry it refers to."""
    ref = schema.get("$ref")
    return doc["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else schema


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


class EchoItem(BaseModel):
    text: str


class EchoRequest(BaseModel):
    name: str
    items: list[EchoItem] = []


async def test_describe_registers_a_routes_models():
    async def echo(request):
        return PlainTextResponse("{}")

    openapi.describe("/test-only/echo", "post", EchoRequest, {"type": "object"}, summary="Echo",
                     stream_media_type="application/x-ndjson", error_statuses=(400, 404),
                     error_schema=openapi.OllamaErrorBody)
    app = Starlette(routes=[Route("/test-only/echo", echo, methods=["POST"])])
    doc = openapi.build_document(app.routes, title="t", version="0", api_key_required=False)
    op = doc["paths"]["/test-only/echo"]["post"]
    assert op["summary"] == "Echo"
    schema = request_schema(doc, "/test-only/echo")
    assert schema["required"] == ["name"] and schema["properties"]["name"] == {"type": "string"}
    assert schema["properties"]["items"]["items"] == {"$ref": "#/components/schemas/EchoItem"}
    assert doc["components"]["schemas"]["EchoItem"]["required"] == ["text"]  # nested models: by reference
    assert op["responses"]["200"]["content"] == {"application/json": {"schema": {"type": "object"}},
                                                 "application/x-ndjson": {}}
    error = op["responses"]["404"]["content"]["application/json"]["schema"]
    assert error == json_schema(openapi.OllamaErrorBody, "serialization")[0] and error["required"] == ["error"]
    assert set(op["responses"]) == {"200", "400", "404"}


async def test_openai_routes_document_bodies_streams_and_errors():
    app, _, _ = make_app()
    paths = (await document(app))["paths"]
    error_schema = json_schema(openapi.ErrorBody, "serialization")[0]
    for path, request_model, response_model, required in [
        ("/v1/completions", CompletionRequest, CompletionResponse, ["prompt"]),
        ("/v1/chat/completions", ChatRequest, ChatResponse, ["messages"]),
    ]:
        op = paths[path]["post"]
        request = op["requestBody"]["content"]["application/json"]["schema"]
        assert request == json_schema(request_model)[0] and request["required"] == required
        ok = op["responses"]["200"]["content"]
        assert ok["application/json"]["schema"] == json_schema(response_model, "serialization")[0]
        assert ok["text/event-stream"]["schema"]["required"] == ["data"]
        for status in ("400", "404", "413", "500", "503"):
            assert op["responses"][status]["content"]["application/json"]["schema"] == error_schema
        assert "security" not in op  # no API key configured


def test_the_document_loads_in_schemathesis():
    app, _, _ = make_app()
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    results = list(schema.get_all_operations())
    assert results and all(r.ok() for r in results)


def example(field: dict):
    if "examples" in field:
        return field["examples"][0]
    if "anyOf" in field:
        return example(field["anyOf"][0])
    if "$ref" in field:
        return {}
    return {"integer": field.get("minimum", 1) if field.get("minimum", 1) >= 0 else 1, "number": 0.5,
            "boolean": True, "string": "x", "array": ["x"] * field.get("minItems", 0), "object": {}}[field["type"]]


@pytest.mark.parametrize("is_chat", [False, True])
async def test_every_documented_request_field_is_accepted_by_the_parser(is_chat):
    schema = request_schema(await document(make_app()[0]), "/v1/chat/completions" if is_chat else "/v1/completions")
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
                    assert response["content"]["application/json"]["schema"]["title"] == "OllamaErrorBody", path


async def test_the_embeddings_route_documents_its_body():
    app, _, _ = make_app()
    op = (await document(app))["paths"]["/v1/embeddings"]["post"]
    request = op["requestBody"]["content"]["application/json"]["schema"]
    assert request == json_schema(EmbeddingRequest)[0] and request["required"] == ["input"]
    assert set(request["properties"]) == {"model", "input", "encoding_format", "dimensions", "user"}
    assert request["properties"]["encoding_format"]["enum"] == ["float", "base64"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == \
        json_schema(EmbeddingResponse, "serialization")[0]
    client = client_for(app)
    for body in [{"input": "hi"}, {"input": ["a", "b"]}, {"input": [1, 2]}, {"input": [[1], "b"]},
                 {"input": "hi", "encoding_format": "base64", "dimensions": None, "user": "u", "model": MODEL}]:
        assert (await client.post("/v1/embeddings", json=body)).status_code == 200, body
    for body in [{"input": ""}, {"input": []}, {"input": [[]]}, {"input": "hi", "dimensions": 4},
                 {"input": "hi", "encoding_format": "int8"}]:
        assert (await client.post("/v1/embeddings", json=body)).status_code == 400, body


SAMPLING_BOUNDS = {  # field: (minimum, maximum, exclusive minimum): vLLM's limits
    "top_k": (-1, 2**31 - 1, None), "n": (1, MAX_N, None), "best_of": (1, MAX_N, None),
    "seed": (-(2**63), 2**63 - 1, None), "min_p": (0, 1, None), "presence_penalty": (-2, 2, None),
    "frequency_penalty": (-2, 2, None), "repetition_penalty": (None, None, 0), "min_tokens": (0, None, None),
    "temperature": (0, None, None), "top_p": (None, 1, 0), "max_tokens": (1, None, None),
}


@pytest.mark.parametrize("is_chat", [False, True])
async def test_sampling_fields_are_documented_with_vllms_bounds(is_chat):
    schema = request_schema(await document(make_app()[0]), "/v1/chat/completions" if is_chat else "/v1/completions")
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
async def test_the_documented_bounds_are_exactly_the_parsers(is_chat):
    """At each documented bound the parser accepts; one step past it, it refuses (a 400, never a 500)."""
    schema = request_schema(await document(make_app()[0]), "/v1/chat/completions" if is_chat else "/v1/completions")
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


async def test_ollama_options_are_documented_and_accepted():
    doc = await document(make_app()[0])
    options = resolved(doc, request_schema(doc, "/api/generate")["properties"]["options"])
    documented = options["properties"]
    assert set(documented) == set(OllamaOptions.model_fields)
    assert (documented["temperature"]["type"], documented["top_k"]["type"], documented["use_mmap"]["type"]) == \
        ("number", "integer", "boolean")
    assert documented["top_p"]["exclusiveMinimum"] == 0 and documented["top_p"]["maximum"] == 1
    assert check_options({name: example(field) for name, field in documented.items()})


async def test_every_request_body_documents_its_required_fields():
    doc = await document(make_app()[0])
    required = {path: request_schema(doc, path, method).get("required")
                for path, methods in doc["paths"].items() for method, op in methods.items()
                if "application/json" in op.get("requestBody", {}).get("content", {})}
    assert required == {
        "/v1/completions": ["prompt"], "/v1/chat/completions": ["messages"], "/v1/embeddings": ["input"],
        "/tokenize": None, "/detokenize": ["tokens"], "/api/copy": ["source", "destination"],
        "/v1/messages": ["model", "max_tokens", "messages"], "/v1/messages/count_tokens": ["model", "messages"],
        "/v1/responses": ["input"],
        **{path: ["query", "documents"] for path in ("/rerank", "/v1/rerank", "/v2/rerank")},
        **{path: ["text_1", "text_2"] for path in ("/score", "/v1/score")},
        "/api/rerank": ["model", "query", "documents"],
        **{path: ["model"] for path in ("/api/show", "/api/delete", "/api/generate", "/api/chat", "/api/embed",
                                        "/api/embeddings", "/api/create", "/api/pull")}}
    assert [form["required"] for form in request_schema(doc, "/tokenize")["oneOf"]] == [["prompt"], ["messages"]]
