"""JSON schemas of Ollama's routes (/api/*, and GET /), for /openapi.json: the requests the handlers in this package
accept, with their bounds, and the bodies they answer with. Errors are Ollama's flat {"error": "..."}.

Fields Ollama has but this server refuses (images, tools, think, logprobs, suffix, quantize, ...) are documented
with the one value that is accepted (empty, or false). Limits that depend on another field or on the server (the
model must exist and run on the served weights; prompt + num_predict is cut at the context; raw excludes template,
system and context) are in the descriptions, and breaking them is a 400 or 404.
"""
from tinyvllm.frontend import openapi
from tinyvllm.frontend.ollama import names
from tinyvllm.frontend.ollama.http_io import NDJSON
from tinyvllm.frontend.ollama.options import IGNORED_OPTIONS

_ERR = openapi.OLLAMA_ERROR_SCHEMA
_STR, _BOOL, _INT = {"type": "string"}, {"type": "boolean"}, {"type": "integer"}
_MODEL = {"type": "string", "minLength": 1, "description": "a model /api/tags lists (the tag defaults to latest)"}
_NAME = {"type": "string", "minLength": 1, "description": "the older spelling of model; model wins"}
_STRINGS = {"type": "array", "items": _STR}
_JSON_TYPES = {int: "integer", float: "number", bool: "boolean"}
_NOT_SUPPORTED = "not supported by this server: only an empty (or false) value is accepted"

OPTIONS = {
    "type": "object",
    "description": "Ollama's options; load-time, hardware and unknown ones are accepted and ignored",
    "properties": {
        "temperature": {"type": "number", "minimum": 0},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": -1, "maximum": 2**31 - 1, "description": "0 or -1: off"},
        "min_p": {"type": "number", "minimum": 0, "maximum": 1},
        "repeat_penalty": {"type": "number", "exclusiveMinimum": 0},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "seed": {"type": "integer", "maximum": 2**63 - 1, "description": "negative: a random seed"},
        "num_predict": {"type": "integer", "description": "at most this many tokens; 0 or less: until the context "
                                                          "ends"},
        "stop": {"oneOf": [_STR, _STRINGS]},
        **{name: {"type": _JSON_TYPES[kind], "description": "ignored"} for name, kind in IGNORED_OPTIONS.items()},
    },
}
_KEEP_ALIVE = {"type": ["string", "number"], "description": "accepted; the served model stays loaded"}
_FORMAT = {"oneOf": [{"type": "string", "enum": ["", "json"]}, {"type": "object"}],
           "description": '"json" or a JSON schema: asked for in the prompt, not enforced while decoding'}
_REFUSED = {"think": {"type": "boolean", "const": False, "description": _NOT_SUPPORTED},
            "logprobs": {"type": "boolean", "const": False, "description": _NOT_SUPPORTED}}
_GENERATION_COMMON = {"model": _MODEL, "name": _NAME, "format": _FORMAT, "options": OPTIONS, "stream": _BOOL,
                      "keep_alive": _KEEP_ALIVE, **_REFUSED}

GENERATE_REQUEST = {
    "type": "object", "required": ["model"],
    "properties": {
        **_GENERATION_COMMON,
        "prompt": {"type": "string", "description": "empty: only (un)loads the model"},
        "system": _STR, "template": {"type": "string", "description": "Go template or jinja"},
        "raw": {"type": "boolean", "description": "the prompt as is; excludes template, system and context"},
        "context": {"type": "array", "items": {"type": "integer", "minimum": 0},
                    "description": "a previous reply's context: token ids below the vocabulary size"},
        "suffix": {"type": "string", "maxLength": 0, "description": _NOT_SUPPORTED},
        "images": {"type": "array", "maxItems": 0, "description": _NOT_SUPPORTED},
    },
}
_CHAT_MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]}, "content": _STR,
    "images": {"type": "array", "maxItems": 0, "description": _NOT_SUPPORTED}}}
CHAT_REQUEST = {
    "type": "object", "required": ["model"],
    "properties": {**_GENERATION_COMMON,
                   "messages": {"type": "array", "items": _CHAT_MESSAGE,
                                "description": "empty: only (un)loads the model"},
                   "tools": {"type": "array", "maxItems": 0, "description": _NOT_SUPPORTED}},
}
_DURATIONS = {name: _INT for name in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
                                      "eval_count", "eval_duration")}


def _reply(text_field: str, text_schema: dict) -> dict:
    return {"type": "object", "required": ["model", "created_at", text_field, "done"],
            "properties": {"model": _STR, "created_at": _STR, text_field: text_schema, "done": _BOOL,
                           "done_reason": _STR, "context": {"type": "array", "items": _INT}, **_DURATIONS}}


GENERATE_RESPONSE = _reply("response", _STR)
CHAT_RESPONSE = _reply("message", {"type": "object", "required": ["role", "content"],
                                   "properties": {"role": {"const": "assistant"}, "content": _STR}})

_EMBED_COMMON = {"model": _MODEL, "name": _NAME, "options": OPTIONS, "keep_alive": _KEEP_ALIVE}
EMBED_REQUEST = {
    "type": "object", "required": ["model"],
    "properties": {**_EMBED_COMMON,
                   "input": {"oneOf": [_STR, _STRINGS], "description": "empty strings are skipped"},
                   "truncate": {"type": "boolean", "description": "cut inputs to the context (default) or 400"},
                   "dimensions": {"type": "integer", "minimum": 1,
                                  "description": "keep the first this many; at most the model's hidden size"}},
}
_VECTOR = {"type": "array", "items": {"type": "number"}}
EMBED_RESPONSE = {"type": "object", "required": ["model", "embeddings"],
                  "properties": {"model": _STR, "embeddings": {"type": "array", "items": _VECTOR},
                                 **{k: _INT for k in ("total_duration", "load_duration", "prompt_eval_count")}}}
EMBEDDINGS_REQUEST = {"type": "object", "required": ["model"], "properties": {**_EMBED_COMMON, "prompt": _STR}}
EMBEDDINGS_RESPONSE = {"type": "object", "required": ["embedding"], "properties": {"embedding": _VECTOR}}

_DETAILS = {"type": "object",
            "required": ["parent_model", "format", "family", "families", "parameter_size", "quantization_level"],
            "properties": {"parent_model": _STR, "format": _STR, "family": _STR,
                           "families": {"type": ["array", "null"], "items": _STR}, "parameter_size": _STR,
                           "quantization_level": _STR}}
_MODEL_ENTRY = {"name": _STR, "model": _STR, "size": _INT, "digest": _STR, "details": _DETAILS}
TAGS_RESPONSE = {"type": "object", "required": ["models"], "properties": {"models": {"type": "array", "items": {
    "type": "object", "required": [*_MODEL_ENTRY, "modified_at"], "properties": {**_MODEL_ENTRY,
                                                                                 "modified_at": _STR}}}}}
_PS_ENTRY = {**_MODEL_ENTRY, "expires_at": _STR, "size_vram": _INT, "context_length": _INT}
PS_RESPONSE = {"type": "object", "required": ["models"], "properties": {"models": {"type": "array", "items": {
    "type": "object", "required": list(_PS_ENTRY), "properties": _PS_ENTRY}}}}
VERSION_RESPONSE = {"type": "object", "required": ["version"], "properties": {"version": _STR}}

_BY_NAME = {"type": "object", "required": ["model"], "properties": {"model": _MODEL, "name": _NAME}}
SHOW_REQUEST = {**_BY_NAME, "properties": {**_BY_NAME["properties"], "verbose": _BOOL}}
_SHOW_FIELDS = {"license": _STR, "modelfile": _STR, "parameters": _STR, "template": _STR, "details": _DETAILS,
                "model_info": {"type": "object"}, "capabilities": _STRINGS, "modified_at": _STR}
SHOW_RESPONSE = {"type": "object", "required": list(_SHOW_FIELDS), "properties": {**_SHOW_FIELDS, "system": _STR}}
_NEW_NAME = {"type": "string", "pattern": names.PATTERN, "description": "[host/][namespace/]model[:tag]"}
COPY_REQUEST = {"type": "object", "required": ["source", "destination"],
                "properties": {"source": _MODEL, "destination": _NEW_NAME}}

_DIGEST = {"type": "string", "pattern": "^sha256[:-][0-9a-f]{64}$"}
CREATE_REQUEST = {
    "type": "object", "required": ["model"],
    "properties": {
        "model": {**_NEW_NAME, "description": "the new model's name; not the served model's"},
        "name": _NAME,
        "from": {"type": "string", "description": "a model /api/tags lists, or a GGUF file or model folder on the "
                                                  "server; this or files (or a Modelfile FROM) is required"},
        "files": {"type": "object", "additionalProperties": _DIGEST,
                  "description": "file name -> the sha256 of a blob uploaded to /api/blobs"},
        "modelfile": {"type": "string", "description": "FROM, PARAMETER, TEMPLATE, SYSTEM, LICENSE"},
        "template": _STR, "system": _STR, "license": {"oneOf": [_STR, _STRINGS]},
        "parameters": OPTIONS, "stream": _BOOL,
        "quantize": {"type": "string", "maxLength": 0, "description": _NOT_SUPPORTED},
        "adapters": {"type": "object", "maxProperties": 0, "description": _NOT_SUPPORTED},
        "messages": {"type": "array", "maxItems": 0, "description": _NOT_SUPPORTED},
    },
}
PULL_REQUEST = {"type": "object", "required": ["model"], "properties": {
    "model": {"type": "string", "minLength": 1, "description": "a model /api/tags lists, the default model, a GGUF "
                                                               "file or model folder path, or a Hugging Face repo "
                                                               "id in the local cache: nothing is downloaded"},
    "name": _NAME, "insecure": _BOOL, "stream": _BOOL}}
STATUS_RESPONSE = {"type": "object", "required": ["status"],
                   "properties": {"status": _STR, "digest": _STR, "total": _INT, "completed": _INT}}

_GENERATION_ERRORS = (400, 404, 413, 500, 503)
_STORE_ERRORS = (400, 404, 413)


def _describe(path: str, method: str, request: dict | None = None, response: dict | None = None, **kwargs) -> None:
    kwargs.setdefault("error_statuses", _STORE_ERRORS)
    openapi.describe(path, method, request, response, error_schema=_ERR, **kwargs)


_describe("/", "GET", summary="Ollama's liveness text", error_statuses=(), response_media_type="text/plain")
_describe("/api/version", "GET", response=VERSION_RESPONSE, summary="The Ollama API version followed",
          error_statuses=())
_describe("/api/tags", "GET", response=TAGS_RESPONSE, summary="Local models", error_statuses=())
_describe("/api/ps", "GET", response=PS_RESPONSE, summary="Running models: the served one", error_statuses=())
_describe("/api/show", "POST", SHOW_REQUEST, SHOW_RESPONSE, summary="A model's details")
_describe("/api/copy", "POST", COPY_REQUEST, summary="Copy a model", response_media_type=None)
_describe("/api/delete", "DELETE", _BY_NAME, summary="Delete a stored model", response_media_type=None)
_describe("/api/generate", "POST", GENERATE_REQUEST, GENERATE_RESPONSE, summary="Generate (stream: NDJSON)",
          stream_media_type=NDJSON, error_statuses=_GENERATION_ERRORS)
_describe("/api/chat", "POST", CHAT_REQUEST, CHAT_RESPONSE, summary="Chat (stream: NDJSON)",
          stream_media_type=NDJSON, error_statuses=_GENERATION_ERRORS)
_describe("/api/embed", "POST", EMBED_REQUEST, EMBED_RESPONSE, summary="Normalised embeddings",
          error_statuses=(*_GENERATION_ERRORS, 501))
_describe("/api/embeddings", "POST", EMBEDDINGS_REQUEST, EMBEDDINGS_RESPONSE, summary="An embedding (older API)",
          error_statuses=(*_GENERATION_ERRORS, 501))
_describe("/api/create", "POST", CREATE_REQUEST, STATUS_RESPONSE, summary="Create a model (stream: NDJSON)",
          stream_media_type=NDJSON)
_describe("/api/pull", "POST", PULL_REQUEST, STATUS_RESPONSE, summary="Pull a model from this machine",
          stream_media_type=NDJSON)
_BLOB = {"digest": {**_DIGEST, "description": "sha256:<64 hex digits>; anything else is a 400"}}
openapi.describe("/api/blobs/{digest}", "HEAD", summary="Whether a blob was uploaded (200) or not (404)",
                 error_statuses=(400, 404), response_media_type=None, path_schemas=_BLOB)
_describe("/api/blobs/{digest}", "POST", {"type": "string", "format": "binary"}, summary="Upload a blob: 201, "
          "or 200 if it was there", request_media_type=openapi.BINARY, response_media_type=None,
          success_statuses=(200, 201), error_statuses=(400,), path_schemas=_BLOB)
