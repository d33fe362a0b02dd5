"""POST /api/generate and POST /api/chat: request fields -> a PreparedRequest for generation.respond."""
from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tinyvllm.frontend.ollama import prompting
from tinyvllm.frontend.ollama.generation import PreparedRequest, load_reply, respond
from tinyvllm.frontend.ollama.http_io import OllamaError, field, handler, model_field, read_json
from tinyvllm.frontend.ollama.model_store import ModelEntry
from tinyvllm.frontend.ollama.options import generation_settings
from tinyvllm.frontend.ollama.service import OllamaService


def parse_format(value: Any) -> Any:
    if value in (None, ""):
        return None
    if value == "json" or isinstance(value, dict):
        return value
    raise OllamaError(f'invalid format: expected "json" or a JSON schema object, got {value!r:.60}')


def is_unload(keep_alive: Any) -> bool:
    return keep_alive is not None and str(keep_alive).strip() in ("0", "0s", "0m", "0h", "0.0")


def refuse_unsupported(body: dict, entry: ModelEntry) -> None:
    if body.get("think") not in (None, False):
        raise OllamaError(f'"{entry.name}" does not support thinking')
    if body.get("logprobs"):
        raise OllamaError("logprobs are not supported on /api/generate and /api/chat yet")
    if body.get("images"):
        raise OllamaError(prompting.images_refused())


def make_routes(service: OllamaService):
    tokenizer = service.tokenizer

    async def start(request: Request) -> tuple[int, dict, ModelEntry]:
        received = time.perf_counter_ns()
        body = await read_json(request, service.max_body_bytes)
        entry = await service.servable(model_field(body))
        refuse_unsupported(body, entry)
        return received, body, entry

    @handler
    async def generate(request: Request) -> Response:
        received, body, entry = await start(request)
        name, prompt = model_field(body), field(body, "prompt", str, "")
        raw, system = field(body, "raw", bool, False), field(body, "system", str)
        template = field(body, "template", str)
        context = prompting.check_context(body.get("context"), tokenizer.vocab_size)
        fmt = parse_format(body.get("format"))
        if field(body, "suffix", str):
            raise OllamaError(f'"{entry.name}" does not support insert (suffix)')
        if raw and (template or system or context):
            raise OllamaError("raw mode does not support template, system, or context")
        settings = generation_settings(entry.parameters, body.get("options"))
        if not prompt:
            return load_reply(name, is_chat=False, unload=is_unload(body.get("keep_alive")))
        if raw:
            text, add_special = prompt, True
        else:
            messages = prompting.with_system([{"role": "user", "content": prompt}], system or entry.system)
            if fmt is not None:
                messages = prompting.with_instruction(messages, prompting.format_instruction(fmt))
            text, add_special = prompting.render(template or entry.template, messages, tokenizer)
        ids = context + await prompting.encode(tokenizer, text, add_special and not context)
        if not ids:
            raise OllamaError("the prompt is empty")
        prep = PreparedRequest(name, False, ids, settings, fmt, not raw, received)
        return await respond(request, service, prep, field(body, "stream", bool, True))

    @handler
    async def chat(request: Request) -> Response:
        received, body, entry = await start(request)
        name = model_field(body)
        messages = prompting.check_messages(body.get("messages") or [])
        fmt = parse_format(body.get("format"))
        if body.get("tools"):
            raise OllamaError(f'"{entry.name}" does not support tools')
        settings = generation_settings(entry.parameters, body.get("options"))
        if not messages:
            return load_reply(name, is_chat=True, unload=is_unload(body.get("keep_alive")))
        messages = prompting.with_system(messages, entry.system)
        if fmt is not None:
            messages = prompting.with_instruction(messages, prompting.format_instruction(fmt))
        text, add_special = prompting.render(entry.template, messages, tokenizer)
        ids = await prompting.encode(tokenizer, text, add_special)
        if not ids:
            raise OllamaError("the prompt is empty")
        prep = PreparedRequest(name, True, ids, settings, fmt, False, received)
        return await respond(request, service, prep, field(body, "stream", bool, True))

    return generate, chat
