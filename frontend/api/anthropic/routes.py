"""POST /v1/messages (streamed or whole) and /v1/messages/count_tokens: a Messages request becomes the OpenAI chat
request it means (messages_request.py) and goes through the same serving path (template, tokenizer, sampling,
grammar-forced tool calls, reasoning, the engine); its reply becomes Anthropic's events (messages_reply.py).
Errors are Anthropic's shape with the status the OpenAI route would answer. `?beta=true` (Claude Code) changes
nothing. Authenticated like every /v1 route, also by `x-api-key` (frontend/api/auth.py)."""
import json
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api import openapi
from tinyvllm.frontend.api.anthropic.errors import MESSAGES_PATH, anthropic_error_body
from tinyvllm.frontend.api.anthropic.messages_reply import message_body, message_events, sse
from tinyvllm.frontend.api.anthropic.messages_request import CountTokensRequest, MessagesRequest, parse_messages_request
from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.api.http_json import (CLIENT_CLOSED_REQUEST, exception_response, read_json_body,
                                             run_unless_disconnected)
from tinyvllm.frontend.api.serving import RequestServing
from tinyvllm.frontend.api.streaming import SSEResponse

COUNT_TOKENS_PATH = MESSAGES_PATH + "/count_tokens"


def anthropic_error(exc: Exception, path: str) -> tuple[int, dict]:
    """The status the OpenAI route would answer for `exc`, and Anthropic's body for it."""
    response = exception_response(exc, path)
    return response.status_code, anthropic_error_body(json.loads(response.body)["error"]["message"],
                                                      response.status_code)


def anthropic_routes(serving: RequestServing, model_name: str, max_body_bytes: int) -> list[Route]:
    async def prompt_of(request: Request, count_only: bool):
        parsed, req = parse_messages_request(await read_json_body(request, max_body_bytes), count_only)
        if parsed.model != model_name:
            raise api.APIError(f"model: {parsed.model} (this server serves {model_name})", 404, "NotFoundError")
        if not count_only and (dead := serving.engine.dead_reason) is not None:
            raise EngineDeadError(dead)  # a 503 before the stream starts, not an error event after message_start
        if not serving.follows_thinking():
            req.thinking_budget = None  # Claude Code asks for a budget whatever the model: where it cannot hold, none
        return req, await serving.prompt_token_ids(req, is_chat=True)

    async def messages(request: Request) -> Response:
        try:
            req, prompt_ids = await prompt_of(request, count_only=False)
            limit, p = serving.max_model_len, len(prompt_ids)
            if p < limit:  # max_tokens is only a ceiling here (Claude Code asks for 32,000): the context's rest at most
                req.max_tokens = min(req.max_tokens, limit - p)
            serving.fit_to_context(req, p)
            message_id = "msg_" + uuid.uuid4().hex
            deltas = serving.generate_reply(message_id, prompt_ids, req)
            events = message_events(deltas, message_id, model_name, len(prompt_ids), req.tools.parse)
            if req.stream:
                return SSEResponse(streamed(events, request.url.path))
            finished, body = await run_unless_disconnected(request, message_body(events))
            return JSONResponse(body) if finished else Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception as e:
            status, body = anthropic_error(e, request.url.path)
            return JSONResponse(body, status_code=status)

    async def streamed(events, path: str):
        try:
            async for name, event in events:
                yield sse(name, event)
        except Exception as e:  # after message_start: Anthropic's error event ends the stream
            yield sse("error", anthropic_error(e, path)[1])
        finally:
            await events.aclose()

    async def count_tokens(request: Request) -> Response:
        try:
            _, prompt_ids = await prompt_of(request, count_only=True)
            return JSONResponse({"input_tokens": len(prompt_ids)})
        except Exception as e:
            status, body = anthropic_error(e, request.url.path)
            return JSONResponse(body, status_code=status)

    return [Route(MESSAGES_PATH, messages, methods=["POST"]), Route(COUNT_TOKENS_PATH, count_tokens, methods=["POST"])]


openapi.describe(MESSAGES_PATH, "POST", MessagesRequest, summary="Anthropic Messages: a reply as content blocks "
                 "(text, thinking, tool_use); stream: true gives Anthropic's events", stream_media_type=openapi.SSE,
                 error_statuses=(400, 404, 413, 503), error_schema=openapi.AnthropicErrorBody, response_schema={
                     "type": "object"})
openapi.describe(COUNT_TOKENS_PATH, "POST", CountTokensRequest, summary="The prompt's token count, as Anthropic's "
                 "count_tokens answers it", error_statuses=(400, 404, 413), error_schema=openapi.AnthropicErrorBody,
                 response_schema={"type": "object"})
