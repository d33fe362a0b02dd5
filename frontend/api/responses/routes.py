"""POST /v1/responses (whole or streamed): the request becomes the chat request it means (request.py) and goes
through the same serving path; the reply becomes Responses output items and events (reply.py). Errors are
OpenAI's shape, as on every /v1 route. With --responses-store-size N the last N responses are kept (store.py):
previous_response_id continues one, GET reads one (its events again with ?stream=true for a background one), DELETE
forgets one, cancel stops a background one. Without a store those ids are 404s."""
import asyncio
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
from tinyvllm.frontend.api.responses.store import ResponseStore, StoredResponse
from tinyvllm.frontend.api.serving import RequestServing
from tinyvllm.frontend.api.streaming import SSEResponse
from tinyvllm.frontend.engine.engine_client import EngineDeadError

PATH = "/v1/responses"


def _echo(parsed: ResponsesRequest, model: str, stored: bool) -> dict:
    """The request's settings as a response repeats them."""
    fmt = parsed.text.format.model_dump(by_alias=True, exclude_none=True) if parsed.text and parsed.text.format else \
        {"type": "text"}
    return {"model": model, "instructions": parsed.instructions, "tools": [t.model_dump() for t in parsed.tools or []],
            "tool_choice": parsed.tool_choice if isinstance(parsed.tool_choice, str) or parsed.tool_choice is None
            else parsed.tool_choice.model_dump(), "parallel_tool_calls": parsed.parallel_tool_calls,
            "temperature": parsed.temperature, "top_p": parsed.top_p, "max_output_tokens": parsed.max_output_tokens,
            "previous_response_id": parsed.previous_response_id, "background": parsed.background,
            "reasoning": {"effort": parsed.reasoning.effort if parsed.reasoning else None, "summary": None},
            "text": {"format": fmt}, "truncation": "disabled", "metadata": parsed.metadata or {}, "store": stored}


def _error_fields(exc: Exception, path: str) -> dict:
    error = json.loads(exception_response(exc, path).body)["error"]
    return {"code": error["type"], "message": error["message"], "param": error["param"]}


def responses_routes(serving: RequestServing, model_name: str, max_body_bytes: int, store_size: int = 0) -> list[Route]:
    store = ResponseStore(store_size) if store_size > 0 else None

    async def create(request: Request) -> Response:
        try:
            parsed, req, items = parse_responses_request(await read_json_body(request, max_body_bytes), store)
            if req.model is not None and req.model != model_name:
                raise api.model_not_found(req.model)
            if (dead := serving.engine.dead_reason) is not None:
                raise EngineDeadError(dead)
            prompt_ids = await serving.prompt_token_ids(req, is_chat=True)
            serving.fit_to_context(req, len(prompt_ids))
            kept = store is not None and parsed.store is not False
            builder = ResponseBuilder(_echo(parsed, model_name, kept), len(prompt_ids),
                                      lambda text: len(serving.tokenizer.encode(text, False)))
            entry = StoredResponse(builder.response, items) if kept else None
            events = response_events(serving.generate_reply(builder.response["id"], prompt_ids, req), builder,
                                     req.tools.parse)
            if parsed.background:
                return await background(entry, events, builder, request.url.path, parsed.stream)
            if req.stream:
                return SSEResponse(streamed(events, builder, entry, request.url.path))

            async def drained() -> dict:
                async for _ in events:
                    pass
                return builder.response
            finished, body = await run_unless_disconnected(request, drained())
            if not finished:
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            keep(entry)
            return JSONResponse(body)
        except Exception as e:
            return exception_response(e, request.url.path)

    def keep(entry: StoredResponse | None) -> None:
        """Stores a finished response; when every place holds a background response still running it is not kept,
        and says so (store false), rather than losing the answer."""
        if entry is not None:
            entry.end()
            try:
                store.put(entry)
            except api.APIError:
                entry.response["store"] = False

    async def streamed(events, builder: ResponseBuilder, entry: StoredResponse | None, path: str):
        try:
            async for event in events:
                yield sse(event)
            keep(entry)
        except Exception as e:  # the stream has begun: an error event ends it
            yield sse(builder._event("error", **_error_fields(e, path)))
        finally:
            await events.aclose()

    async def background(entry: StoredResponse, events, builder: ResponseBuilder, path: str, stream: bool) -> Response:
        builder.response["status"], entry.events = "queued", []
        store.put(entry)

        async def run() -> None:
            try:
                async for event in events:
                    entry.add_event(event)
            except asyncio.CancelledError:
                cancelled(entry)
            except Exception as e:
                fields = _error_fields(e, path)
                builder.response.update(status="failed", error={"code": fields["code"], "message": fields["message"]})
                entry.add_event(builder._event("response.failed", response=builder._snapshot()))
            finally:
                await events.aclose()  # (aborts the request when it was cancelled)
                entry.end()
        entry.task = asyncio.create_task(run())
        if stream:
            return SSEResponse(sse(event) async for event in entry.replay())
        return JSONResponse(builder._snapshot())

    async def retrieve(request: Request) -> Response:
        try:
            entry = _stored(request)
            if request.query_params.get("stream") == "true":
                if entry.events is None:
                    raise api.APIError("Only background responses can be streamed again", param="stream")
                after = request.query_params.get("starting_after", "-1")
                if not (after == "-1" or after.isascii() and after.isdigit()):
                    raise api.APIError("starting_after must be a sequence number (0 or more)", param="starting_after")
                return SSEResponse(sse(event) async for event in entry.replay(int(after)))
            return JSONResponse(entry.response)
        except Exception as e:
            return exception_response(e, request.url.path)

    async def delete(request: Request) -> Response:
        try:
            entry = _stored(request, pop=True)
            if entry.task is not None:
                entry.task.cancel()
            return JSONResponse({"id": entry.response["id"], "object": "response", "deleted": True})
        except Exception as e:
            return exception_response(e, request.url.path)

    async def cancel(request: Request) -> Response:
        try:
            entry = _stored(request)
            if entry.task is None:
                raise api.APIError("Cannot cancel a synchronous response.", param="response_id")
            if entry.running:  # a finished one is answered as it is
                entry.task.cancel()
                await asyncio.gather(entry.task, return_exceptions=True)
                if entry.running:  # cancelled before it began
                    cancelled(entry)
                    entry.end()
            return JSONResponse(entry.response)
        except Exception as e:
            return exception_response(e, request.url.path)

    def cancelled(entry: StoredResponse) -> None:
        """A background response stopped: cancelled, the item it was writing incomplete."""
        entry.response["status"] = "cancelled"
        for item in entry.response["output"]:
            if item.get("status") == "in_progress":
                item["status"] = "incomplete"

    def _stored(request: Request, pop: bool = False) -> StoredResponse:
        response_id = request.path_params["response_id"]
        if store is None:
            raise api.APIError(f"Response with id '{response_id}' not found: this server keeps no responses "
                               "(--responses-store-size)", 404, "NotFoundError", "response_id")
        return store.pop(response_id) if pop else store.get(response_id)

    return [Route(PATH, create, methods=["POST"]),
            Route(PATH + "/{response_id}", retrieve, methods=["GET"]),
            Route(PATH + "/{response_id}", delete, methods=["DELETE"]),
            Route(PATH + "/{response_id}/cancel", cancel, methods=["POST"])]


openapi.describe(PATH, "POST", ResponsesRequest, {"type": "object"}, summary="OpenAI Responses: output items "
                 "(reasoning, message, function_call); stream: true gives its events", stream_media_type=openapi.SSE,
                 error_statuses=(400, 404, 413, 503))
for method, path in (("GET", PATH + "/{response_id}"), ("DELETE", PATH + "/{response_id}"),
                     ("POST", PATH + "/{response_id}/cancel")):
    openapi.describe(path, method, summary="A stored response (--responses-store-size; without it a 404)",
                     error_statuses=(400, 404), response_schema={"type": "object"})
