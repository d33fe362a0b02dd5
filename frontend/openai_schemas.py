"""JSON schemas of the OpenAI routes, for /openapi.json: the requests frontend/openai_protocol.py (and
frontend/embeddings.py) accept and the bodies they answer with. A field added to a parser belongs here too, with
the parser's bounds (tests/frontend/test_openapi.py checks that the parser accepts every field documented here;
schemathesis then fuzzes them).

Fields may also be null (meaning "the default"); the schemas leave that out to keep generated requests meaningful.
What one field allows can depend on another (min_tokens <= max_tokens, best_of == n, token ids within the
vocabulary, prompt + max_tokens within the context): those limits are in the descriptions, and a request that
breaks them gets a 400.
"""
from tinyvllm.frontend import openapi
from tinyvllm.frontend.embeddings import ENCODING_FORMATS
from tinyvllm.protocol.sampling import MAX_LOGPROBS, MAX_N

_INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0},
              "description": "token ids, each below the vocabulary size"}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_PENALTY = {"type": "number", "minimum": -2, "maximum": 2}
_USER = {"type": "string", "description": "accepted and ignored"}

SAMPLING_PROPERTIES = {
    "model": {"type": "string", "description": "The served model name; optional."},
    "max_tokens": {"type": "integer", "minimum": 1, "description": "prompt + max_tokens must fit the context"},
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1, "maximum": 2**31 - 1, "description": "0 or -1: off"},
    "n": {"type": "integer", "minimum": 1, "maximum": MAX_N},
    "best_of": {"type": "integer", "minimum": 1, "maximum": MAX_N,
                "description": "must equal n (its default): best_of > n is not supported yet"},
    "seed": _INT64,
    "stop": {"oneOf": [{"type": "string"}, _STRINGS]},
    "stop_token_ids": _TOKEN_IDS,
    "ignore_eos": {"type": "boolean"},
    "skip_special_tokens": {"type": "boolean"},
    "add_special_tokens": {"type": "boolean"},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                       "description": "Only with stream=true."},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "presence_penalty": _PENALTY,
    "frequency_penalty": _PENALTY,
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
    "min_tokens": {"type": "integer", "minimum": 0, "description": "At most max_tokens (16 for completions)."},
    "logit_bias": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                   "additionalProperties": {"type": "number"},
                   "description": "token id (as a string) -> bias added to its logit, clamped to [-100, 100]"},
    "include_stop_str_in_output": {"type": "boolean"},
    "echo": {"type": "boolean"},
    "user": _USER,
}
_TOP_LOGPROBS = {"type": "integer", "minimum": 0, "maximum": MAX_LOGPROBS}
# stream_options only with stream: true (anything else is a 400)
_STREAM_OPTIONS_NEED_STREAM = {"stream_options": {"required": ["stream"], "properties": {"stream": {"const": True}}}}

COMPLETION_REQUEST = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        **SAMPLING_PROPERTIES,
        "prompt": {"oneOf": [
            {"type": "string"},
            {**_TOKEN_IDS, "minItems": 1},
            {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
            {"type": "array", "items": {**_TOKEN_IDS, "minItems": 1}, "minItems": 1, "maxItems": 1},
        ]},
        "logprobs": {**_TOP_LOGPROBS, "description": "how many top logprobs per token (and per prompt token "
                                                     "with echo)"},
    },
    "dependentSchemas": _STREAM_OPTIONS_NEED_STREAM,
}

_CONTENT_PART = {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {"role": {"type": "string", "enum": ["system", "user", "assistant"]},
                   "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _CONTENT_PART}]}},
}
CHAT_MESSAGES = {"type": "array", "items": _MESSAGE, "minItems": 1}

CHAT_REQUEST = {
    "type": "object",
    "required": ["messages"],
    "properties": {**SAMPLING_PROPERTIES, "messages": CHAT_MESSAGES,
                   "max_completion_tokens": {"type": "integer", "minimum": 1, "description": "wins over max_tokens"},
                   "logprobs": {"type": "boolean"},
                   "top_logprobs": {**_TOP_LOGPROBS, "description": "needs logprobs: true"}},
    # top_logprobs > 0 needs logprobs: true; the schema asks for it whenever top_logprobs is given
    "dependentSchemas": {**_STREAM_OPTIONS_NEED_STREAM, "top_logprobs": {
        "required": ["logprobs"], "properties": {"logprobs": {"const": True}}}},
}

_INPUT_IDS = {**_TOKEN_IDS, "minItems": 1}
EMBEDDING_REQUEST = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "model": SAMPLING_PROPERTIES["model"],
        "input": {"description": "each text or token id list is embedded on its own and must fit the context",
                  "oneOf": [{"type": "string", "minLength": 1}, _INPUT_IDS,
                            {"type": "array", "minItems": 1,
                             "items": {"oneOf": [{"type": "string", "minLength": 1}, _INPUT_IDS]}}]},
        "encoding_format": {"type": "string", "enum": list(ENCODING_FORMATS),
                            "description": "base64: little-endian float32"},
        "dimensions": {"type": "null", "description": "not supported: the vectors have the model's hidden size, "
                                                      "and any number is a 400"},
        "user": _USER,
    },
}

_USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {"prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
                   "total_tokens": {"type": "integer"},
                   "prompt_tokens_details": {"type": ["object", "null"],
                                             "properties": {"cached_tokens": {"type": "integer"}}}},
}
_FINISH = {"type": ["string", "null"]}
_STOP_REASON = {"type": ["string", "integer", "null"]}


def _response(object_type: str, choice: dict) -> dict:
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {"id": {"type": "string"}, "object": {"const": object_type}, "created": {"type": "integer"},
                       "model": {"type": "string"}, "choices": {"type": "array", "items": choice}, "usage": _USAGE},
    }


COMPLETION_RESPONSE = _response("text_completion", {
    "type": "object",
    "required": ["index", "text", "finish_reason"],
    "properties": {"index": {"type": "integer"}, "text": {"type": "string"}, "logprobs": {},
                   "finish_reason": _FINISH, "stop_reason": _STOP_REASON},
})
CHAT_RESPONSE = _response("chat.completion", {
    "type": "object",
    "required": ["index", "message", "finish_reason"],
    "properties": {"index": {"type": "integer"}, "logprobs": {}, "finish_reason": _FINISH,
                   "stop_reason": _STOP_REASON,
                   "message": {"type": "object", "required": ["role", "content"],
                               "properties": {"role": {"const": "assistant"},
                                              "content": {"type": ["string", "null"]}}}},
})
MODELS_RESPONSE = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {
        "type": "object", "required": ["id", "object", "created", "owned_by"],
        "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                       "owned_by": {"type": "string"}, "root": {"type": ["string", "null"]},
                       "parent": {"type": ["string", "null"]},
                       # null for a stored model that runs on other weights than the served one
                       "max_model_len": {"type": ["integer", "null"]}}}}},
}
EMBEDDING_RESPONSE = {
    "type": "object",
    "required": ["id", "object", "created", "model", "data", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "list"}, "created": {"type": "integer"},
        "model": {"type": "string"},
        "data": {"type": "array", "items": {
            "type": "object", "required": ["index", "object", "embedding"],
            "properties": {"index": {"type": "integer"}, "object": {"const": "embedding"},
                           "embedding": {"type": ["array", "string"], "items": {"type": "number"},
                                         "description": "a string with encoding_format base64"}}}},
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"],
                  "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}},
    },
}

_GENERATION_ERRORS = (400, 404, 413, 500, 503)
openapi.describe("/v1/completions", "POST", COMPLETION_REQUEST, COMPLETION_RESPONSE, summary="Text completion",
                 stream_media_type="text/event-stream", error_statuses=_GENERATION_ERRORS)
openapi.describe("/v1/chat/completions", "POST", CHAT_REQUEST, CHAT_RESPONSE, summary="Chat completion",
                 stream_media_type="text/event-stream", error_statuses=_GENERATION_ERRORS)
openapi.describe("/v1/embeddings", "POST", EMBEDDING_REQUEST, EMBEDDING_RESPONSE,
                 summary="Embeddings: the model's mean-pooled, normalised final hidden states",
                 error_statuses=_GENERATION_ERRORS)
openapi.describe("/v1/models", "GET", response_schema=MODELS_RESPONSE, summary="The served model", error_statuses=())
