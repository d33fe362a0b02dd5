"""POST /tokenize and POST /detokenize, shaped as vLLM serves them.

/tokenize takes `{model?, prompt, add_special_tokens=true, return_token_strs=false}` or the chat form
`{model?, messages, add_generation_prompt=true, add_special_tokens=false, return_token_strs=false}` and answers
`{count, max_model_len, tokens, token_strs}` (token_strs null unless asked for). The chat form renders the chat
template exactly as /v1/chat/completions does, so `count` is the prompt_tokens a chat request would report.
/detokenize takes `{model?, tokens}` and answers `{prompt}`, special tokens included (as vLLM does).
Neither checks max_model_len: they only describe text.
"""
import asyncio
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinyvllm.frontend import openai_protocol as api
from tinyvllm.frontend import openapi
from tinyvllm.frontend.http_json import error_response, read_json_object
from tinyvllm.frontend.openai_schemas import CHAT_MESSAGES
from tinyvllm.frontend.serving import LONG_INPUT_CHARS

log = logging.getLogger(__name__)


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise api.APIError(f"'{name}' must be a boolean, got {value!r:.100}", param=name)
    return value


def _token_ids(body: dict, name: str, vocab_size: int) -> list[int]:
    ids = body.get(name)
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise api.APIError(f"'{name}' must be a list of integers", param=name)
    if (bad := next((t for t in ids if not 0 <= t < vocab_size), None)) is not None:
        raise api.APIError(f"Token id {bad} in '{name}' is out of vocabulary (size {vocab_size})", param=name)
    return ids


async def _run(size: int, fn, *args) -> Any:
    return await asyncio.to_thread(fn, *args) if size > LONG_INPUT_CHARS else fn(*args)


class Tokenization:
    def __init__(self, tokenizer, model_name: str, max_model_len: int, max_body_bytes: int):
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.max_body_bytes = max_body_bytes

    async def _read(self, request: Request) -> dict:
        body = await read_json_object(request, self.max_body_bytes)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise api.APIError(f"'model' must be a string, got {model!r:.100}", param="model")
        if model is not None and model != self.model_name:
            raise api.model_not_found(model)
        return body

    def _render_chat(self, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        except Exception as e:  # the template only sees user input, so whatever it rejects is a bad request
            raise api.APIError(f"Could not apply the chat template: {e}", param="messages") from None

    async def _prompt_text(self, body: dict) -> tuple[str, bool]:
        """The text to tokenize and whether to add special tokens, from either form of the request."""
        if body.get("messages") is not None:
            if body.get("prompt") is not None:
                raise api.APIError("Give either 'prompt' or 'messages', not both", param="prompt")
            if _flag(body, "continue_final_message", False):
                raise api.APIError("continue_final_message is not supported", param="continue_final_message")
            # the chat route's own message checks and flattening, and nothing else of it
            messages = api.parse_chat_request({"messages": body["messages"]}).messages
            size = sum(len(m["content"]) for m in messages)
            text = await _run(size, self._render_chat, messages, _flag(body, "add_generation_prompt", True))
            return text, _flag(body, "add_special_tokens", False)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise api.APIError("'prompt' (a string) or 'messages' is required", param="prompt")
        return prompt, _flag(body, "add_special_tokens", True)

    def _token_strs(self, ids: list[int]) -> list[str]:
        id_to_token = getattr(self.tokenizer, "id_to_token", None)
        if id_to_token is None:  # a tokenizer without a vocabulary lookup: each token's own text
            return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]
        return [id_to_token(i) or "" for i in ids]

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await self._read(request)
            text, add_special_tokens = await self._prompt_text(body)
            ids = await _run(len(text), self.tokenizer.encode, text, add_special_tokens)
            token_strs = self._token_strs(ids) if _flag(body, "return_token_strs", False) else None
            return JSONResponse({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
                                 "token_strs": token_strs})
        except api.APIError as e:
            return error_response(e)
        except Exception:
            log.exception("unexpected error in /tokenize")
            return error_response(api.APIError("Internal server error", 500, "InternalServerError"))

    async def detokenize(self, request: Request) -> Response:
        try:
            body = await self._read(request)
            ids = _token_ids(body, "tokens", self.tokenizer.vocab_size)
            text = await _run(len(ids), self.tokenizer.decode, ids, False)
            return JSONResponse({"prompt": text})
        except api.APIError as e:
            return error_response(e)
        except Exception:
            log.exception("unexpected error in /detokenize")
            return error_response(api.APIError("Internal server error", 500, "InternalServerError"))


def tokenization_routes(tokenizer, model_name: str, max_model_len: int, max_body_bytes: int) -> list[Route]:
    handlers = Tokenization(tokenizer, model_name, max_model_len, max_body_bytes)
    return [Route("/tokenize", handlers.tokenize, methods=["POST"]),
            Route("/detokenize", handlers.detokenize, methods=["POST"])]


_MODEL = {"type": "string", "description": "The served model name; optional."}
_FLAG = {"type": "boolean"}
TOKENIZE_REQUEST = {"oneOf": [
    {"type": "object", "required": ["prompt"], "title": "TokenizeCompletionRequest",
     "properties": {"model": _MODEL, "prompt": {"type": "string"}, "add_special_tokens": _FLAG,
                    "return_token_strs": _FLAG}},
    {"type": "object", "required": ["messages"], "title": "TokenizeChatRequest",
     "properties": {"model": _MODEL, "messages": CHAT_MESSAGES, "add_generation_prompt": _FLAG,
                    "add_special_tokens": _FLAG, "return_token_strs": _FLAG}},
]}
TOKENIZE_RESPONSE = {
    "type": "object", "required": ["count", "max_model_len", "tokens", "token_strs"],
    "properties": {"count": {"type": "integer"}, "max_model_len": {"type": "integer"},
                   "tokens": {"type": "array", "items": {"type": "integer"}},
                   "token_strs": {"type": ["array", "null"], "items": {"type": "string"}}},
}
DETOKENIZE_REQUEST = {"type": "object", "required": ["tokens"],
                      "properties": {"model": _MODEL, "tokens": {"type": "array", "items": {"type": "integer",
                                                                                             "minimum": 0}}}}
DETOKENIZE_RESPONSE = {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}

openapi.describe("/tokenize", "POST", TOKENIZE_REQUEST, TOKENIZE_RESPONSE, summary="Text or chat -> token ids",
                 error_statuses=(400, 404, 413, 500))
openapi.describe("/detokenize", "POST", DETOKENIZE_REQUEST, DETOKENIZE_RESPONSE, summary="Token ids -> text",
                 error_statuses=(400, 404, 413, 500))
