"""The OpenAPI document served at /openapi.json, built from the app's own route list.

Every route the app has appears in the document, described or not; a route's module describes it once, at import,
with the pydantic models of its bodies (the request models are the ones that validate the route's requests):

    from tinyvllm.frontend.api import openapi
    openapi.describe("/api/chat", "POST", ChatRequest, ChatReply, summary="Ollama chat",
                     stream_media_type="application/x-ndjson", error_statuses=(400, 404),
                     error_schema=openapi.OllamaErrorBody)

Schemas are JSON Schema (OpenAPI 3.1): a request body's model inline, the models it refers to under
components/schemas. A route without a description is listed with a `default` response: any status and body may come
back, so a fuzzer can only check it for 5xx.
"""
import re
from dataclasses import dataclass

from pydantic import BaseModel
from starlette.routing import BaseRoute, Mount, Route

from tinyvllm.frontend.api import auth
from tinyvllm.frontend.api.request_models import json_schema

OPENAPI_VERSION = "3.1.0"
JSON = "application/json"
BINARY = "application/octet-stream"
SSE = "text/event-stream"


class SSEEvent(BaseModel):
    """One server-sent event (before OpenAPI 3.2, an event stream's schema is per event)."""
    data: str  # a JSON chunk, an error object, or [DONE] last


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorBody(BaseModel):
    """{"error": {message, type, param, code}}: every OpenAI-style error body (openai_protocol.error_body)."""
    error: ErrorInfo


class OllamaErrorBody(BaseModel):
    """Ollama's errors are flat: {"error": "..."}."""
    error: str


class AnthropicErrorInfo(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    """Anthropic's: {"type": "error", "error": {type, message}} (frontend/api/anthropic/errors.py)."""
    type: str
    error: AnthropicErrorInfo


# a body: a pydantic model, a tuple of them (one of), or a raw JSON schema (e.g. a binary upload's)
Body = type[BaseModel] | tuple[type[BaseModel], ...] | dict
_UNAUTHORIZED_SCHEMAS = {auth.OPENAI: ErrorBody, auth.OLLAMA: OllamaErrorBody, auth.ANTHROPIC: AnthropicErrorBody}
_STATUS_TEXT = {200: "OK", 201: "Created", 400: "Bad request", 401: "Missing or wrong API key",
                404: "Not found (e.g. an unknown model)", 405: "Method not allowed", 413: "Request body too large",
                500: "Internal server error", 501: "Not implemented on this server", 503: "Engine not available"}


@dataclass(frozen=True, slots=True)
class Operation:
    summary: str = ""
    request_schema: Body | None = None
    response_schema: Body | None = None
    stream_media_type: str | None = None  # a second 200 media type, e.g. text/event-stream when stream=true
    error_statuses: tuple[int, ...] = ()
    error_schema: Body | None = None
    response_media_type: str | None = JSON  # e.g. text/plain for /metrics; None: no body
    request_media_type: str = JSON  # e.g. application/octet-stream for an upload
    success_statuses: tuple[int, ...] = (200,)  # each with the 200's content
    path_schemas: tuple[tuple[str, dict], ...] = ()  # path parameter -> its schema (default: any string)


_operations: dict[tuple[str, str], Operation] = {}


def describe(path: str, method: str, request_schema: Body | None = None, response_schema: Body | None = None, *,
             summary: str = "", stream_media_type: str | None = None, error_statuses: tuple[int, ...] = (400,),
             error_schema: Body | None = None, response_media_type: str | None = JSON, request_media_type: str = JSON,
             success_statuses: tuple[int, ...] = (200,), path_schemas: dict[str, dict] | None = None) -> None:
    """Registers the schemas of one route (the full path, as clients call it). Calling it again replaces them.

    request_schema: the body's schema in request_media_type (JSON unless told).
    response_schema: the 200 body in response_media_type (None there: the route answers without a body).
    stream_media_type: what the 200 is when the client asks for a stream; text/event-stream gets a per-event schema.
    error_statuses: the error codes the route answers with, each with error_schema (default: OpenAI's shape), as
    JSON; without a body when response_media_type is None and no error_schema is given (e.g. /health's 503).
    401 is added by itself when an API key guards the route.
    success_statuses: the codes that mean success (e.g. 200 and 201), each described like the 200.
    path_schemas: the schemas of path parameters ({name} in the path) that are not just any string.
    """
    _operations[(path, method.upper())] = Operation(summary, request_schema, response_schema, stream_media_type,
                                                    tuple(error_statuses), error_schema, response_media_type,
                                                    request_media_type, tuple(success_statuses),
                                                    tuple((path_schemas or {}).items()))


def described(path: str, method: str) -> Operation | None:
    return _operations.get((path, method.upper()))


def app_operations(routes: list[BaseRoute], prefix: str = "") -> list[tuple[str, str]]:
    """(path, method) of every HTTP route, mounts included; the HEAD that Starlette adds to each GET is left out
    unless it was described."""
    found = []
    for route in routes:
        if isinstance(route, Mount):
            found += app_operations(route.routes, prefix + route.path)
        elif isinstance(route, Route) and route.include_in_schema:  # False: an endless stream (/dashboard/events)
            path = prefix + route.path_format
            methods = sorted(route.methods or ["GET"])
            found += [(path, m) for m in methods if m != "HEAD" or "GET" not in methods or described(path, m)]
    return found


def _schema(body: Body | None, mode: str, components: dict[str, dict]) -> dict:
    """A body's JSON schema; the models it refers to go into `components` (components/schemas)."""
    if body is None or isinstance(body, dict):
        return body or {}
    if isinstance(body, tuple):
        return {"oneOf": [_schema(model, mode, components) for model in body]}
    schema, refs = json_schema(body, mode)
    for name, ref_schema in refs.items():
        if components.setdefault(name, ref_schema) != ref_schema:
            raise ValueError(f"two different schemas are both named {name!r}: rename one of the models")
    return schema


def _with_content(response: dict, media_type: str | None, schema: dict) -> dict:
    if media_type is not None:
        response.setdefault("content", {})[media_type] = {"schema": schema}
    return response


def _responses(op: Operation, path: str, protected: bool, components: dict) -> dict:
    def schema(body: Body | None) -> dict:
        return _schema(body, "serialization", components)

    ok = _with_content({"description": "OK"}, op.response_media_type, schema(op.response_schema))
    if op.stream_media_type == SSE:
        _with_content(ok, SSE, schema(SSEEvent))
    elif op.stream_media_type:
        ok.setdefault("content", {})[op.stream_media_type] = {}  # e.g. NDJSON: no schema, the stream is opaque
    responses = {str(status): {**ok, "description": _STATUS_TEXT.get(status, "Success")}
                 for status in sorted(set(op.success_statuses))}
    error_media_type = JSON if op.response_media_type is not None or op.error_schema is not None else None
    for status in sorted(set(op.error_statuses)):
        responses[str(status)] = _with_content({"description": _STATUS_TEXT.get(status, "Error")}, error_media_type,
                                               schema(op.error_schema or ErrorBody))
    if protected:
        responses["401"] = _with_content({"description": _STATUS_TEXT[401]}, JSON,
                                         schema(_UNAUTHORIZED_SCHEMAS[auth.error_style(path)]))
    return responses


def _operation_object(path: str, method: str, protected: bool, components: dict) -> dict:
    op = described(path, method)
    # undescribed: any status and body may come back, so only "no 5xx" can be checked against it
    responses = _responses(op, path, protected, components) if op else {"default": {"description": "Not described"}}
    obj: dict = {"summary": op.summary if op and op.summary else f"{method} {path}",
                 "operationId": _operation_id(path, method), "responses": responses}
    obj.update(_path_parameters(path, dict(op.path_schemas) if op else {}))
    if op and op.request_schema is not None:
        obj["requestBody"] = _with_content({"required": True}, op.request_media_type,
                                           _schema(op.request_schema, "validation", components))
    if protected:
        obj["security"] = [{"bearer": []}]
    return obj


def _path_parameters(path: str, schemas: dict[str, dict]) -> dict:
    names = re.findall(r"{(\w+)}", path)
    return {"parameters": [{"name": n, "in": "path", "required": True, "schema": schemas.get(n, {"type": "string"})}
                           for n in names]} if names else {}


def _operation_id(path: str, method: str) -> str:
    return method.lower() + "_" + (re.sub(r"\W+", "_", path).strip("_") or "root")


def build_document(routes: list[BaseRoute], *, title: str, version: str, api_key_required: bool) -> dict:
    paths: dict[str, dict] = {}
    components: dict[str, dict] = {}
    for path, method in app_operations(routes):
        protected = api_key_required and auth.is_protected(path)
        paths.setdefault(path, {})[method.lower()] = _operation_object(path, method, protected, components)
    doc = {"openapi": OPENAPI_VERSION, "info": {"title": title, "version": version}, "paths": paths,
           "components": {"schemas": components}}
    if api_key_required:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
