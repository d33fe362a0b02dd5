"""Runs one /api/generate or /api/chat request on the engine and shapes Ollama's chunks and final object.

Durations are nanoseconds: load_duration is the time spent before the engine had the request (parsing, templating,
tokenizing: there is no model to load), prompt_eval_duration until the first text, eval_duration after it.

`format` ("json" or a JSON schema) is approximate: the prompt asks for JSON (see prompting.format_instruction),
the reply is buffered, and the first JSON value in it is returned, or the reply as generated if there is none;
decoding is not constrained, so a small model can answer in prose where Ollama's grammar-constrained sampling
would not.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tinyvllm.frontend.ollama.http_io import CLIENT_CLOSED_REQUEST, streamed, timestamp, unless_disconnected
from tinyvllm.frontend.ollama.options import GenerationSettings
from tinyvllm.frontend.ollama.service import OllamaService
from tinyvllm.frontend.openai_protocol import GenerationRequest

log = logging.getLogger(__name__)


@dataclass
class PreparedRequest:
    model: str  # as the client named it (echoed back)
    is_chat: bool
    prompt_ids: list[int]
    settings: GenerationSettings
    json_format: Any  # None, "json" or a JSON schema
    return_context: bool
    received_ns: int  # time.perf_counter_ns() when the request arrived


def text_chunk(prep: PreparedRequest, text: str, done: bool = False) -> dict:
    chunk: dict[str, Any] = {"model": prep.model, "created_at": timestamp()}
    if prep.is_chat:
        chunk["message"] = {"role": "assistant", "content": text}
    else:
        chunk["response"] = text
    chunk["done"] = done
    return chunk


def load_reply(model: str, is_chat: bool, unload: bool) -> Response:
    """An empty prompt / message list: Ollama's way to (un)load a model. The one model here is always loaded."""
    prep = PreparedRequest(model, is_chat, [], None, None, False, 0)
    return JSONResponse({**text_chunk(prep, "", done=True), "done_reason": "unload" if unload else "load"})


def extract_json(text: str, schema: Any) -> str:
    """The first JSON value in `text` (as text) that has the schema's basics; else `text` as generated.

    The model's reply is never an error: a reply cut off by num_predict is unfinished JSON with Ollama too, and a
    small model may answer in prose whatever the prompt asks (decoding is not constrained here)."""
    decoder, start = json.JSONDecoder(), 0
    while (start := _next_json_start(text, start)) >= 0:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            start += 1
            continue
        if _fits(value, schema):
            return text[start:end]
        start = end
    log.info("format: the model's reply holds no JSON value that fits the format; returned as generated")
    return text


def _next_json_start(text: str, start: int) -> int:
    positions = [p for p in (text.find("{", start), text.find("[", start)) if p >= 0]
    return min(positions) if positions else -1


def _fits(value: Any, schema: Any) -> bool:
    """Whether a JSON value has a schema's top-level type (object or array) and required keys."""
    if not isinstance(schema, dict):
        return True
    kind = schema.get("type")
    if kind == "object" and not isinstance(value, dict) or kind == "array" and not isinstance(value, list):
        return False
    required = schema.get("required", [])
    return not isinstance(value, dict) or not isinstance(required, list) or all(
        not isinstance(k, str) or k in value for k in required)


async def chunks(service: OllamaService, prep: PreparedRequest) -> AsyncIterator[dict]:
    """Text chunks (done false), then the final object (done true) with the counts and durations."""
    req = GenerationRequest(model=prep.model, sampling=prep.settings.sampling, max_tokens=prep.settings.max_tokens,
                            stop=prep.settings.stop)
    limit, p = service.max_model_len, len(prep.prompt_ids)
    if req.max_tokens is not None and p < limit:
        req.max_tokens = min(req.max_tokens, limit - p)  # Ollama stops at the context's end instead of refusing
    service.serving.fit_to_context(req, p)
    req_id = f"ollama-{uuid.uuid4().hex}"
    submitted_ns = time.perf_counter_ns()
    first_ns, last, held = None, None, []
    try:
        async with aclosing(service.serving.generate_text(req_id, prep.prompt_ids, req)) as deltas:
            async for last in deltas:
                first_ns = first_ns or time.perf_counter_ns()
                if prep.json_format is not None:
                    held.append(last.text)
                elif last.text:
                    yield text_chunk(prep, last.text)
        generated = service.recorder.generated.get(req_id, [])
    finally:
        service.recorder.generated.pop(req_id, None)
    end_ns = time.perf_counter_ns()
    if prep.json_format is not None:
        yield text_chunk(prep, extract_json("".join(held), prep.json_format))
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
        pieces, final = [], None
        async with aclosing(items):
            async for item in items:
                if item["done"]:
                    final = item
                else:
                    pieces.append(item["message"]["content"] if prep.is_chat else item["response"])
        if prep.is_chat:
            final["message"]["content"] = "".join(pieces)
        else:
            final["response"] = "".join(pieces)
        return final

    finished, final = await unless_disconnected(request, collect())
    return JSONResponse(final) if finished else Response(status_code=CLIENT_CLOSED_REQUEST)
