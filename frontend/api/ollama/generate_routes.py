"""POST /api/generate and POST /api/chat: request fields -> a PreparedRequest for generation.respond."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tinyvllm.frontend.api.ollama import prompting
from tinyvllm.frontend.api.ollama.generation import PreparedRequest, load_reply, respond, think_variables
from tinyvllm.frontend.api.ollama.http_io import OllamaError, handler, read_request
from tinyvllm.frontend.api.ollama.keep_alive import is_unload
from tinyvllm.frontend.api.ollama.model_store import ModelEntry
from tinyvllm.frontend.api.ollama.options import generation_settings
from tinyvllm.frontend.api.ollama.requests import ChatRequest, GenerateRequest, GenerationFields
from tinyvllm.frontend.api.ollama.service import OllamaService
from tinyvllm.frontend.api.structured_output import GrammarInvalid, ollama_grammar
from tinyvllm.frontend.api.tool_calls import check_tools, message_dict, template_messages


def _json_format(req: GenerationFields) -> Any:
    """None, "json" or a JSON schema."""
    return None if req.format == "" else req.format


def _constrained(settings, fmt: Any):
    """The settings with fmt's grammar in their sampling parameters; a broken schema is a 400 naming the problem."""
    try:
        settings.sampling.grammar = ollama_grammar(fmt)
    except GrammarInvalid as e:
        raise OllamaError(e.message) from None
    return settings


def make_routes(service: OllamaService):
    tokenizer, reasoning = service.tokenizer, service.serving.reasoning

    async def start(request: Request, model: type[GenerationFields]) -> tuple[int, Any, ModelEntry]:
        received = time.perf_counter_ns()
        req = await read_request(request, model, service.max_body_bytes)
        entry = await service.servable(req.model_name)
        return received, req, entry

    @handler
    async def generate(request: Request) -> Response:
        received, req, entry = await start(request, GenerateRequest)
        name, prompt, raw, system, template = req.model_name, req.prompt, req.raw, req.system, req.template
        context, fmt = prompting.check_context(req.context, tokenizer.vocab_size), _json_format(req)
        if raw and (template or system or context):
            raise OllamaError("raw mode does not support template, system, or context")
        settings = _constrained(generation_settings(entry.parameters, req.options), fmt)
        if not prompt:
            return load_reply(name, is_chat=False, unload=is_unload(req.keep_alive))
        settings.sampling.lora = await asyncio.to_thread(service.adapter_of, entry)
        thinking = think_variables(req.think, reasoning)
        if raw:
            text, add_special = prompt, True
        else:
            messages = prompting.with_system([{"role": "user", "content": prompt}], system or entry.system)
            if fmt is not None:
                messages = prompting.with_instruction(messages, prompting.format_instruction(fmt))
            text, add_special = prompting.render(template or entry.template, messages, tokenizer, thinking)
        ids = context + await prompting.encode(tokenizer, text, add_special and not context)
        if not ids:
            raise OllamaError("the prompt is empty")
        prep = PreparedRequest(name, False, ids, settings, not raw, received,
                               reasoning_opened=reasoning is not None and not raw and reasoning.opened_by(text))
        return await respond(request, service, prep, req.stream)

    @handler
    async def chat(request: Request) -> Response:
        received, req, entry = await start(request, ChatRequest)
        name, fmt = req.model_name, _json_format(req)
        messages = [message_dict(m.role, m.content, [c.model_dump() for c in m.tool_calls], name=m.tool_name)
                    for m in req.messages]
        try:
            functions = check_tools([t.model_dump() for t in req.tools])
        except GrammarInvalid as e:
            raise OllamaError(e.message) from None
        settings = _constrained(generation_settings(entry.parameters, req.options), fmt)
        if not messages:
            return load_reply(name, is_chat=True, unload=is_unload(req.keep_alive))
        settings.sampling.lora = await asyncio.to_thread(service.adapter_of, entry)
        messages = prompting.with_system(messages, entry.system)
        if fmt is not None:
            messages = prompting.with_instruction(messages, prompting.format_instruction(fmt))
        messages, extra = template_messages(messages, functions,
                                            tokenizer.chat_template if entry.template is None else None)
        text, add_special = prompting.render(entry.template, messages, tokenizer,
                                             {**extra, **think_variables(req.think, reasoning)})
        ids = await prompting.encode(tokenizer, text, add_special)
        if not ids:
            raise OllamaError("the prompt is empty")
        prep = PreparedRequest(name, True, ids, settings, False, received, parse_tool_calls=bool(functions),
                               reasoning_opened=reasoning is not None and reasoning.opened_by(text))
        return await respond(request, service, prep, req.stream)

    return generate, chat
