"""Request -> prompt token ids: messages, system prompts, templates (the model's own, or a TEMPLATE override in
Go-template syntax or jinja), raw prompts, `context` continuation, and the instruction `format` adds."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tinyvllm.frontend.api.ollama import go_template
from tinyvllm.frontend.api.ollama.http_io import OllamaError

LONG_INPUT_CHARS = 4096  # tokenize longer texts in a thread so the event loop keeps streaming
_RESPONSE_MARK = "\x00tinyvllm-response\x00"  # where the reply starts in a rendered Go template


def format_instruction(fmt: Any) -> str:
    if fmt == "json":
        return "\n\nRespond with a single valid JSON object and nothing else."
    return f"\n\nRespond with a single valid JSON value and nothing else, matching this JSON schema: {json.dumps(fmt)}"


def with_instruction(messages: list[dict], instruction: str) -> list[dict]:
    """Appends `instruction` to the last user message."""
    messages = [dict(m) for m in messages]
    for m in reversed(messages):
        if m["role"] == "user":
            m["content"] += instruction
            return messages
    return messages + [{"role": "user", "content": instruction.strip()}]


def with_system(messages: list[dict], system: str | None) -> list[dict]:
    """The model's SYSTEM prompt comes first unless the messages bring their own."""
    if not system or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system}, *messages]


def render(template: str | None, messages: list[dict], tokenizer, extra: dict | None = None) -> tuple[str, bool]:
    """The prompt text up to where the reply starts, and whether the tokenizer should add BOS itself.
    extra: more variables for the model's own template (its tools)."""
    if template is None:
        try:
            return tokenizer.apply_chat_template(messages, add_generation_prompt=True, **(extra or {})), False
        except ValueError as e:
            raise OllamaError(f"could not apply the chat template: {e}") from None
    if "{%" in template:
        return _render_jinja(template, messages, tokenizer), False
    if ".Messages" in template:
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        prompt = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        data = {"System": system, "Prompt": prompt, "Response": "", "Suffix": "",
                "Messages": [{"Role": m["role"], "Content": m["content"]} for m in messages]}
        return go_template.render(template, data), True
    return _render_turns(template, messages), True


def _render_turns(template: str, messages: list[dict]) -> str:
    """A template without .Messages renders once per (system, prompt, response) turn; the last one is cut where
    its .Response would go."""
    turns, system, prompt = [], "", ""
    for m in messages:
        if m["role"] == "system":
            system = m["content"] if not system else f"{system}\n\n{m['content']}"
        elif m["role"] == "assistant":
            turns.append((system, prompt, m["content"]))
            system = prompt = ""
        else:
            prompt = m["content"] if not prompt else f"{prompt}\n\n{m['content']}"
    last = turns.pop() if turns and not prompt and not system else (system, prompt, "")
    out = [go_template.render(template, {"System": s, "Prompt": p, "Response": r}) for s, p, r in turns]
    final = go_template.render(template, {"System": last[0], "Prompt": last[1], "Response": last[2] + _RESPONSE_MARK})
    out.append(final.split(_RESPONSE_MARK, 1)[0])
    return "".join(out)


def _render_jinja(template: str, messages: list[dict], tokenizer) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                                bos_token=getattr(tokenizer, "bos_token", "") or "",
                                                eos_token=getattr(tokenizer, "eos_token", "") or "")
    except Exception as e:
        raise OllamaError(f"could not apply the template: {e}") from None


async def encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    if len(text) > LONG_INPUT_CHARS:
        return await asyncio.to_thread(tokenizer.encode, text, add_special_tokens)
    return tokenizer.encode(text, add_special_tokens)


def check_context(context: list[int], vocab_size: int) -> list[int]:
    if (bad := next((t for t in context if not 0 <= t < vocab_size), None)) is not None:
        raise OllamaError(f"'context' holds token id {bad}, outside the vocabulary (size {vocab_size})")
    return context
