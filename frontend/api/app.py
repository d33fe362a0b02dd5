"""The HTTP app: OpenAI-compatible routes, rerank and score, /tokenize and /detokenize, and the operators' routes
(/health, /metrics, /version, /openapi.json, /dashboard), behind the optional API-key check."""
import time
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api import openapi, streaming, tool_call_replies
from tinyvllm.frontend.api.anthropic.routes import anthropic_routes
from tinyvllm.frontend.api.responses.routes import responses_routes
from tinyvllm.frontend.api.auth import APIKeyMiddleware, error_body_for
from tinyvllm.frontend.api.beam_search_completion import beam_search_completion
from tinyvllm.frontend.api.dashboard import dashboard_routes
from tinyvllm.frontend.engine.detokenizer import IncrementalDetokenizer
from tinyvllm.frontend.api.embedding_routes import embedding_routes
from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.engine.lora_adapters import LoRAAdapters
from tinyvllm.frontend.api.http_json import (CLIENT_CLOSED_REQUEST, DEFAULT_MAX_BODY_BYTES,
                                             exception_response, read_json_body, run_unless_disconnected)
from tinyvllm.frontend.api.metrics import FrontendMetrics
from tinyvllm.frontend.api.ollama.routes import mount_ollama
from tinyvllm.frontend.api.ollama.service import entry_adapter
from tinyvllm.frontend.api.openai_requests import ChatRequest, CompletionRequest
from tinyvllm.frontend.api.openai_responses import ChatResponse, CompletionResponse, ModelList
from tinyvllm.frontend.api.kv_event_routes import kv_event_routes
from tinyvllm.frontend.api.lora_routes import lora_routes
from tinyvllm.frontend.api.ops_routes import ops_routes
from tinyvllm.frontend.api.reasoning import reasoning_format
from tinyvllm.frontend.api.rerank_routes import rerank_routes
from tinyvllm.frontend.api.request_gate import GateMiddleware, RequestGate
from tinyvllm.frontend.api.served_engine import ServedEngine
from tinyvllm.frontend.api.serving import CompletionResult, RequestServing, collect, keep_best
from tinyvllm.frontend.api.tokenize_routes import tokenization_routes


_GENERATION_ERRORS = (400, 404, 413, 500, 503, 504)
openapi.describe("/v1/completions", "POST", CompletionRequest, CompletionResponse, summary="Text completion",
                 stream_media_type=openapi.SSE, error_statuses=_GENERATION_ERRORS)
openapi.describe("/v1/chat/completions", "POST", ChatRequest, ChatResponse, summary="Chat completion",
                 stream_media_type=openapi.SSE, error_statuses=_GENERATION_ERRORS)
openapi.describe("/v1/models", "GET", response_schema=ModelList, summary="The served model", error_statuses=())


def response_body(result: CompletionResult, req: api.GenerationRequest, request_id: str, model: str,
                  created: int) -> dict:
    if req.is_chat:
        make_body = api.chat_body
        choices = [tool_call_replies.chat_choice(c, req.tools.parse) for c in result.choices]
    else:
        make_body = api.completion_body
        choices = [api.completion_choice(c.index, c.text, c.finish_reason, c.stop_reason, c.logprobs)
                   for c in result.choices]
    usage = api.usage_body(result.num_prompt_tokens, result.num_generated_tokens, result.num_cached_tokens)
    body = make_body(request_id, model, choices, usage, created)
    if result.kv_transfer_params is not None:  # a prefill instance's answer (vLLM's contract)
        body["kv_transfer_params"] = result.kv_transfer_params
    return body


def build_app(engine, tokenizer, model_name: str, max_model_len: int, *, model_root: str | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, models_dir: str | None = None,
              make_detokenizer: Callable = IncrementalDetokenizer, api_key: str | None = None,
              gate: RequestGate | None = None, allowed_origins: list[str] | None = None,
              default_max_tokens: int | None = None, reasoning_parser: str | None = None,
              responses_store_size: int = 0, adapters: LoRAAdapters | None = None) -> Starlette:
    """engine: an EngineClient (or anything with its generate/stats/dead_reason);
    tokenizer: a protocol.tokenizer.Tokenizer (encode, vocab_size, eos_token_ids, apply_chat_template).

    make_detokenizer(tokenizer, prompt_token_ids, skip_special_tokens=...): tests swap in a simpler one.
    api_key: when given, every /v1 and /api route needs `Authorization: Bearer <api_key>` (frontend/api/auth.py).
    gate: the waiting limit, request deadline and drain (frontend/api/request_gate.py; default: its defaults).
    allowed_origins: the browser origins CORS lets in ("*": any); None: no CORS headers at all.
    default_max_tokens: the limit of a chat request that sets none (OpenAI max_tokens, Ollama num_predict);
    None: the rest of the context.
    reasoning_parser: --reasoning-parser (frontend/api/reasoning.py); None: the one the chat template implies.
    responses_store_size: --responses-store-size (frontend/api/responses/store.py); 0: no store.
    adapters: the LoRA adapters served by name (--lora-modules; frontend/api/lora_routes.py changes them).
    """
    gate = gate or RequestGate()
    metrics = FrontendMetrics(engine, model_name, max_model_len, gate)
    serving = RequestServing(ServedEngine(engine, gate, metrics), tokenizer, max_model_len, make_detokenizer, metrics,
                             default_max_tokens, reasoning_format(reasoning_parser, tokenizer.chat_template))
    started_at = int(time.time())
    served_adapter = None  # (set below, once the model store is read)

    async def generation(request: Request, is_chat: bool) -> Response:
        try:
            body = await read_json_body(request, max_body_bytes)
            req = api.parse_chat_request(body) if is_chat else api.parse_completion_request(body)
            adapter = adapters.get(req.model) if adapters is not None else None
            if adapter is None and req.model in (None, model_name):
                adapter = served_adapter  # a stored model made with an ADAPTER, served under its own name
            if req.model is not None and req.model != model_name and adapter is None:
                raise api.model_not_found(req.model)
            req.sampling.lora = adapter
            if engine.dead_reason is not None:
                raise EngineDeadError(engine.dead_reason)
            served_as = adapter.name if adapter is not None else model_name
            if adapter is not None and req.beam_search is not None:
                raise api.APIError("beam search with a LoRA adapter is not supported yet", param="use_beam_search")
            prompt_ids = await serving.prompt_token_ids(req, is_chat)
            serving.fit_to_context(req, len(prompt_ids))
            request_id, created = api.new_request_id(is_chat), int(time.time())
            if req.beam_search is not None:
                work = beam_search_completion(serving, request_id, prompt_ids, req)
            else:
                generate = serving.generate_reply if is_chat else serving.generate_text
                deltas, n = generate(request_id, prompt_ids, req), req.sampling.n
                if req.tools.parse and req.stream:  # (a whole reply's calls are parsed from its whole answer)
                    deltas = tool_call_replies.with_tool_calls(deltas, n)
                if req.stream:
                    events = streaming.chat_events if is_chat else streaming.completion_events
                    return streaming.SSEResponse(events(deltas, request_id, served_as, created, req.include_usage, n))
                work = collect(deltas, n)
            finished, result = await run_unless_disconnected(request, work)
            if not finished:
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            if req.best_of_keep is not None:
                result = keep_best(result, req.best_of_keep)
            return JSONResponse(response_body(result, req, request_id, served_as, created))
        except Exception as e:
            return exception_response(e, request.url.path)

    async def completions(request: Request) -> Response:
        return await generation(request, is_chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generation(request, is_chat=True)

    async def models(request: Request) -> Response:
        card = {"id": model_name, "object": "model", "created": started_at, "owned_by": "tinyvllm",
                "root": model_root or model_name, "parent": None, "max_model_len": max_model_len}
        lora_cards = [{**card, "id": a.name, "root": a.path, "parent": model_name, "max_model_len": None}
                      for a in (adapters.by_name.values() if adapters is not None else ())]
        return JSONResponse({"object": "list", "data": [card, *lora_cards, *model_store.openai_cards(started_at)]})

    async def http_error(request: Request, exc: HTTPException) -> Response:
        type_ = {404: "NotFoundError", 405: "MethodNotAllowedError"}.get(exc.status_code, "BadRequestError")
        response = JSONResponse(error_body_for(request.url.path, exc.detail, exc.status_code, type_),
                                status_code=exc.status_code)
        response.headers.update(exc.headers or {})  # a 405 must say which methods are allowed
        return response

    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            *anthropic_routes(serving, model_name, max_body_bytes),
            *responses_routes(serving, model_name, max_body_bytes, responses_store_size),
            *tokenization_routes(tokenizer, model_name, max_model_len, max_body_bytes),
            *embedding_routes(ServedEngine(engine, gate), tokenizer, model_name, max_model_len, max_body_bytes),
            *rerank_routes(ServedEngine(engine, gate), tokenizer, model_name, max_model_len, max_body_bytes),
            *ops_routes(engine, metrics),
            *dashboard_routes(engine, metrics, gate, model_name, api_key),
            *kv_event_routes(engine, gate),
            *(lora_routes(adapters, max_body_bytes) if adapters is not None else []),
        ],
        exception_handlers={HTTPException: http_error},
        middleware=[*([Middleware(CORSMiddleware, allow_origins=allowed_origins, allow_methods=["*"],
                                  allow_headers=["*"])] if allowed_origins else []),
                    *([Middleware(APIKeyMiddleware, api_key=api_key)] if api_key else []),
                    Middleware(GateMiddleware, gate=gate, max_body_bytes=max_body_bytes)],
    )
    app.state.metrics = metrics
    app.state.gate = gate
    app.state.serving = serving
    model_store = mount_ollama(app, ServedEngine(engine, gate), serving, model_name, model_root, models_dir,
                               max_body_bytes, adapters)  # /api/*
    if adapters is not None and model_store.served.adapter is not None:
        served_adapter = entry_adapter(model_store.served)
        adapters.check(served_adapter)
    app.state.api_key_required = bool(api_key)
    return app
