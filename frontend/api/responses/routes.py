"""POST /v1/responses (whole or streamed): the request becomes the chat request it means (request.py) and goes
through the same serving path; the reply becomes Responses output items and events (reply.py). Errors are
OpenAI's shape, as on every /v1 route. Nothing is stored: GET, DELETE and cancel of a response id are 404s."""
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api import openapi
from tinyvllm.frontend.api.http_json import (CLIENT_CLOSED_REQUEST, exception_response, read_json_body,
                                             run_unless_disconnected)
from tinyvllm.frontend.api.responses.reply import ResponseBuilder, response_events, sse
from tinyvllm.frontend.api.responses.request import ResponsesRequest, parse_responses_request
from tinyvllm.frontend.api.serving import RequestServing
from tinyvllm.frontend.api.streaming import SSEResponse
from tinyvllm.frontend.engine.engine_client import EngineDeadError

PATH = "/v1/responses"


def _echo(parsed: ResponsesRequest, model: str) -> dict:
    """The request's settings as a response repeats them."""
    fmt = parsed.text.format.model_dump(by_alias=True, exclude_none=True) if parsed.text and parsed.text.format else \
        {"type": "text"}
    return {"model": model, "instructions": parsed.instructions, "tools": [t.model_dump() for t in parsed.tools or []],
            "tool_choice": parsed.tool_choice if isinstance(parsed.tool_choice, str) or parsed.tool_choice is None
            else parsed.tool_choice.model_dump(), "parallel_tool_calls": parsed.parallel_tool_calls,
            "temperature": parsed.temperature, "top_p": parsed.top_p, "max_output_tokens": parsed.max_output_tokens,
            "previous_response_id": None, "reasoning": {"effort": parsed.reasoning.effort if parsed.reasoning else None,
                                                        "summary": None},
            "text": {"format": fmt}, "truncation": "disabled", "metadata": parsed.metadata or {}, "store": False}


def responses_routes(serving: RequestServing, model_name: str, max_body_bytes: int) -> list[Route]:
    async def create(request: Request) -> Response:
        try:
            parsed, req = parse_responses_request(await read_json_body(request, max_body_bytes))
            if req.model is not None and req.model != model_name:
                raise api.model_not_found(req.model)
            if (dead := serving.engine.dead_reason) is not None:
                raise EngineDeadError(dead)
            prompt_ids = await serving.prompt_token_ids(req, is_chat=True)
            serving.fit_to_context(req, len(prompt_ids))
            builder = ResponseBuilder(_echo(parsed, model_name), len(prompt_ids),
                                      lambda text: len(serving.tokenizer.encode(text, False)))
            deltas = serving.generate_reply(builder.response["id"], prompt_ids, req)
            events = response_events(deltas, builder, req.tools.parse)
            if req.stream:
                return SSEResponse(streamed(events, builder, request.url.path))

            async def drained() -> dict:
                async for _ in events:
                    pass
                return builder.response
            finished, body = await run_unless_disconnected(request, drained())
            return JSONResponse(body) if finished else Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception as e:
            return exception_response(e, request.url.path)

    async def streamed(events, builder: ResponseBuilder, path: str):
        try:
            async for event in events:
                yield sse(event)
        except Exception as e:  # the stream has begun: an error event ends it
            error = json.loads(exception_response(e, path).body)["error"]
            yield sse(builder._event("error", code=error["type"], message=error["message"], param=error["param"]))
        finally:
            await events.aclose()

    async def stored(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        return exception_response(api.APIError(f"Response with id '{response_id}' not found: this server keeps no "
                                               "responses", 404, "NotFoundError", "response_id"), request.url.path)

    return [Route(PATH, create, methods=["POST"]),
            Route(PATH + "/{response_id}", stored, methods=["GET", "DELETE"]),
            Route(PATH + "/{response_id}/cancel", stored, methods=["POST"])]


openapi.describe(PATH, "POST", ResponsesRequest, {"type": "object"}, summary="OpenAI Responses: output items "
                 "(reasoning, message, function_call); stream: true gives its events", stream_media_type=openapi.SSE,
                 error_statuses=(400, 404, 413, 503))
for method, path in (("GET", PATH + "/{response_id}"), ("DELETE", PATH + "/{response_id}"),
                     ("POST", PATH + "/{response_id}/cancel")):
    openapi.describe(path, method, summary="A stored response: none are kept here (404)", error_statuses=(404,),
                     response_schema={"type": "object"})
