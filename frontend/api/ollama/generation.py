"""Runs one /api/generate or /api/chat request on the engine and shapes Ollama's chunks and final object.

Durations are nanoseconds: load_duration is the time spent before the engine had the request (parsing, templating,
tokenizing: there is no model to load), prompt_eval_duration until the first text, eval_duration after it.

`format` ("json" or a JSON schema) is enforced while decoding: its grammar travels in the sampling parameters
(generate_routes; frontend/api/structured_output.py) and masks every sampled token on the worker. The prompt asks for
JSON too (prompting.format_instruction), so the model's own choices fit the grammar more often.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tinyvllm.frontend.api.http_json import CLIENT_CLOSED_REQUEST, run_unless_disconnected
from tinyvllm.frontend.api.ollama.options import GenerationSettings
from tinyvllm.frontend.api.ollama.service import OllamaService
from tinyvllm.frontend.api.ollama.http_io import OllamaError, streamed, timestamp
from tinyvllm.frontend.api.openai_protocol import GenerationRequest
from tinyvllm.frontend.api.reasoning import ReasoningFormat
from tinyvllm.frontend.api.reply_parts import ReplyEnd, reply_parts

@dataclass
class PreparedRequest:
    model: str  # as the client named it (echoed back)
    is_chat: bool
    prompt_ids: list[int]
    settings: GenerationSettings
    return_context: bool
    received_ns: int  # time.perf_counter_ns() when the request arrived
    parse_tool_calls: bool = False  # chat with tools: calls in the reply become message.tool_calls
    reasoning_opened: bool = False  # the prompt left a think block open (frontend/api/reasoning.py)


def think_variables(think, reasoning: ReasoningFormat | None) -> dict:
    """Ollama's `think` as the chat template's variables; a model that does not think refuses it, as Ollama does."""
    if think is None:
        return {}
    if think and reasoning is None:
        raise OllamaError("the served model does not support thinking")
    return {"enable_thinking": bool(think), **({"reasoning_effort": think} if isinstance(think, str) else {})}


def text_chunk(prep: PreparedRequest, text: str, done: bool = False, thinking: str = "") -> dict:
    chunk: dict[str, Any] = {"model": prep.model, "created_at": timestamp()}
    if prep.is_chat:
        chunk["message"] = {"role": "assistant", "content": text, **({"thinking": thinking} if thinking else {})}
    else:
        chunk["response"] = text
        if thinking:
            chunk["thinking"] = thinking
    chunk["done"] = done
    return chunk


def load_reply(model: str, is_chat: bool, unload: bool) -> Response:
    """An empty prompt / message list: Ollama's way to (un)load a model. The one model here is always loaded."""
    prep = PreparedRequest(model, is_chat, [], None, False, 0)
    return JSONResponse({**text_chunk(prep, "", done=True), "done_reason": "unload" if unload else "load"})


async def chunks(service: OllamaService, prep: PreparedRequest) -> AsyncIterator[dict]:
    """Text chunks (done false), then the final object (done true) with the counts and durations."""
    req = GenerationRequest(model=prep.model, sampling=prep.settings.sampling, max_tokens=prep.settings.max_tokens,
                            stop=prep.settings.stop, reasoning_opened=prep.reasoning_opened)
    limit, p = service.max_model_len, len(prep.prompt_ids)
    if req.max_tokens is not None and p < limit:
        req.max_tokens = min(req.max_tokens, limit - p)  # Ollama stops at the context's end instead of refusing
    service.serving.fit_to_context(req, p)
    req.sampling.thinking = service.serving.thinking_params(prep.reasoning_opened, None)
    req_id = f"ollama-{uuid.uuid4().hex}"
    submitted_ns = time.perf_counter_ns()
    first_ns, last = None, None

    async def stamped(deltas: AsyncIterator) -> AsyncIterator:  # the first token's time, before any text is held back
        nonlocal first_ns
        async with aclosing(deltas):
            async for delta in deltas:
                first_ns = first_ns or time.perf_counter_ns()
                yield delta
    try:
        parts = reply_parts(stamped(service.serving.generate_reply(req_id, prep.prompt_ids, req)),
                            prep.parse_tool_calls)
        async with aclosing(parts):
            async for part in parts:
                if isinstance(part, ReplyEnd):
                    last = part.last
                    if part.calls:
                        chunk = text_chunk(prep, "")
                        chunk["message"]["tool_calls"] = [call.ollama() for call in part.calls]
                        yield chunk
                elif part[0] == "thinking":
                    yield text_chunk(prep, "", thinking=part[1])
                else:
                    yield text_chunk(prep, part[1])
        generated = service.recorder.generated.get(req_id, [])
    finally:
        service.recorder.generated.pop(req_id, None)
    end_ns = time.perf_counter_ns()
    final = text_chunk(prep, "", done=True)
    final["done_reason"] = last.finish_reason if last is not None else "stop"
    if prep.return_context:
        final["context"] = prep.prompt_ids + generated
    first_ns = first_ns or end_ns
    final.update(total_duration=end_ns - prep.received_ns, load_duration=submitted_ns - prep.received_ns,
                 prompt_eval_count=p, prompt_eval_duration=first_ns - submitted_ns,
                 eval_count=last.num_generated_tokens if last is not None else 0, eval_duration=end_ns - first_ns)
    yield final


async def respond(request: Request, service: OllamaService, prep: PreparedRequest, stream: bool) -> Response:
    items = chunks(service, prep)
    if stream:
        return await streamed(request, items)

    async def collect() -> dict:
        pieces, thoughts, final, calls = [], [], None, []
        async with aclosing(items):
            async for item in items:
                if item["done"]:
                    final = item
                else:
                    body = item["message"] if prep.is_chat else item
                    pieces.append(body["content"] if prep.is_chat else body["response"])
                    thoughts.append(body.get("thinking", ""))
                    calls += body.get("tool_calls", []) if prep.is_chat else []
        body = final["message"] if prep.is_chat else final
        body["content" if prep.is_chat else "response"] = "".join(pieces)
        if thinking := "".join(thoughts):
            body["thinking"] = thinking
        if calls:
            body["tool_calls"] = calls
        return final

    finished, final = await run_unless_disconnected(request, collect())
    return JSONResponse(final) if finished else Response(status_code=CLIENT_CLOSED_REQUEST)
