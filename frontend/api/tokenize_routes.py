"""POST /tokenize and POST /detokenize, shaped as vLLM serves them.

/tokenize takes `{model?, prompt, add_special_tokens=true, return_token_strs=false}` or the chat form
`{model?, messages, add_generation_prompt=true, add_special_tokens=false, return_token_strs=false}` and answers
`{count, max_model_len, tokens, token_strs}` (token_strs null unless asked for). The chat form renders the chat
template exactly as /v1/chat/completions does, so `count` is the prompt_tokens a chat request would report.
/detokenize takes `{model?, tokens}` and answers `{prompt}`, special tokens included (as vLLM does).
Neither checks max_model_len: they only describe text.
"""
import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api import openapi
from tinyvllm.frontend.api.http_json import exception_response, read_json_object
from tinyvllm.frontend.api.openai_requests import DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest
from tinyvllm.frontend.api.openai_responses import DetokenizeResponse, TokenizeResponse
from tinyvllm.frontend.api.serving import LONG_INPUT_CHARS



async def _run(size: int, fn, *args) -> Any:
    return await asyncio.to_thread(fn, *args) if size > LONG_INPUT_CHARS else fn(*args)


class Tokenization:
    def __init__(self, tokenizer, model_name: str, max_model_len: int, max_body_bytes: int):
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.max_body_bytes = max_body_bytes

    def _checked(self, req: Any) -> Any:
        if req.model is not None and req.model != self.model_name:
            raise api.model_not_found(req.model)
        return req

    def _render_chat(self, messages: list[dict], add_generation_prompt: bool, template_kwargs: dict) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                      **template_kwargs)
        except Exception as e:  # the template only sees user input, so whatever it rejects is a bad request
            raise api.APIError(f"Could not apply the chat template: {e}", param="messages") from None

    async def _prompt_text(self, req: TokenizeCompletionRequest | TokenizeChatRequest) -> str:
        if isinstance(req, TokenizeCompletionRequest):
            return req.prompt
        messages = api.message_dicts(req.messages)
        size = sum(len(m["content"]) for m in messages)
        template_kwargs = api.template_kwargs(req.chat_template_kwargs or {}, None)
        return await _run(size, self._render_chat, messages, req.add_generation_prompt, template_kwargs)

    def _token_strs(self, ids: list[int]) -> list[str]:
        id_to_token = getattr(self.tokenizer, "id_to_token", None)
        if id_to_token is None:  # a tokenizer without a vocabulary lookup: each token's own text
            return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]
        return [id_to_token(i) or "" for i in ids]

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await read_json_object(request, self.max_body_bytes)
            if body.get("messages") is not None and body.get("prompt") is not None:
                raise api.APIError("Give either 'prompt' or 'messages', not both", param="prompt")
            form = TokenizeChatRequest if body.get("messages") is not None else TokenizeCompletionRequest
            req = self._checked(api.validated(form, body))
            text = await self._prompt_text(req)
            ids = await _run(len(text), self.tokenizer.encode, text, req.add_special_tokens)
            token_strs = self._token_strs(ids) if req.return_token_strs else None
            return JSONResponse({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
                                 "token_strs": token_strs})
        except Exception as e:
            return exception_response(e, request.url.path)

    async def detokenize(self, request: Request) -> Response:
        try:
            req = self._checked(api.validated(DetokenizeRequest, await read_json_object(request, self.max_body_bytes)))
            ids, vocab_size = req.tokens, self.tokenizer.vocab_size
            if (bad := next((t for t in ids if not 0 <= t < vocab_size), None)) is not None:
                raise api.APIError(f"Token id {bad} in 'tokens' is out of vocabulary (size {vocab_size})",
                                   param="tokens")
            text = await _run(len(ids), self.tokenizer.decode, ids, False)
            return JSONResponse({"prompt": text})
        except Exception as e:
            return exception_response(e, request.url.path)


def tokenization_routes(tokenizer, model_name: str, max_model_len: int, max_body_bytes: int) -> list[Route]:
    handlers = Tokenization(tokenizer, model_name, max_model_len, max_body_bytes)
    return [Route("/tokenize", handlers.tokenize, methods=["POST"]),
            Route("/detokenize", handlers.detokenize, methods=["POST"])]


openapi.describe("/tokenize", "POST", (TokenizeCompletionRequest, TokenizeChatRequest), TokenizeResponse,
                 summary="Text or chat -> token ids", error_statuses=(400, 404, 413, 500))
openapi.describe("/detokenize", "POST", DetokenizeRequest, DetokenizeResponse, summary="Token ids -> text",
                 error_statuses=(400, 404, 413, 500))
