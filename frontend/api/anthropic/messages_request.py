"""An Anthropic Messages request, validated, and the OpenAI chat request it becomes: `system` a system message,
text blocks a message's text, `tool_use` blocks an assistant's tool_calls, `tool_result` blocks tool messages,
`tools` functions, `tool_choice` auto/any/tool/none as auto/required/named/none, `thinking` enabled or disabled the
chat template's enable_thinking (and its budget_tokens the thinking_token_budget), `output_config.format` (a JSON
schema) the response_format. temperature, top_p and top_k, which the 2026 SDKs no longer send, are honoured where
older clients do. A past turn's thinking blocks are dropped (chat templates drop them too). The chat parser then
checks the rest (sampling ranges, the tools' schemas) as it checks an OpenAI request."""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api.request_models import RequestModel, Reworded
from tinyvllm.frontend.api.tool_calls import MAX_TOOLS


class TextBlock(RequestModel):
    type: Literal["text"]
    text: str


class ToolUseBlock(RequestModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(RequestModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False


class ThinkingBlock(RequestModel):
    type: Literal["thinking", "redacted_thinking"]


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]


class Message(RequestModel):
    role: Literal["user", "assistant"]
    content: Annotated[str | list[ContentBlock], Reworded(
        "{where} must be a string or a list of text, tool_use, tool_result or thinking blocks (images are not "
        "supported: the model reads text)")]


class AnthropicTool(RequestModel):
    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ToolChoice(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(RequestModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int | None, Field(ge=0, le=2**31 - 1)] = None  # enabled: the thinking's most tokens


class OutputFormat(RequestModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(RequestModel):
    format: OutputFormat | None = None


class MessagesRequest(RequestModel):
    model: str
    max_tokens: Annotated[int, Field(ge=1), Reworded("max_tokens: a positive integer is required", when_missing=True)]
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float | None, Field(ge=0, le=1)] = None
    top_p: Annotated[float | None, Field(gt=0, le=1)] = None
    top_k: Annotated[int | None, Field(ge=0)] = None
    stream: bool = False
    tools: Annotated[list[AnthropicTool] | None, Field(max_length=MAX_TOOLS)] = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None  # format: a JSON schema the reply follows (structured output)
    metadata: dict[str, Any] | None = None


class CountTokensRequest(MessagesRequest):
    max_tokens: int | None = None  # count_tokens takes no limit


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "\n".join(block.text for block in content)


def _messages(req: MessagesRequest) -> list[dict]:
    out = [{"role": "system", "content": _text(req.system)}] if req.system else []
    for m in req.messages:
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        text = _text([b for b in m.content if isinstance(b, TextBlock)])
        if m.role == "assistant":
            calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                     for b in m.content if isinstance(b, ToolUseBlock)]
            out.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
            continue
        out += [{"role": "tool", "tool_call_id": b.tool_use_id,
                 "content": ("Error: " if b.is_error else "") + _text(b.content)}
                for b in m.content if isinstance(b, ToolResultBlock)]
        if text or not any(isinstance(b, ToolResultBlock) for b in m.content):
            out.append({"role": "user", "content": text})
    return out


def _tool_choice(choice: ToolChoice | None) -> str | dict | None:
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise api.APIError("tool_choice of type tool needs the tool's name", param="tool_choice")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def chat_request_body(req: MessagesRequest) -> dict:
    """The OpenAI chat request body this Messages request means."""
    body: dict[str, Any] = {"model": req.model, "messages": _messages(req), "stream": req.stream}
    if req.max_tokens is not None:
        body["max_tokens"] = req.max_tokens
    for name, value in (("temperature", req.temperature), ("top_p", req.top_p), ("top_k", req.top_k),
                        ("stop", req.stop_sequences)):
        if value is not None:
            body[name] = value
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.input_schema}} for t in req.tools]
        if (choice := _tool_choice(req.tool_choice)) is not None:
            body["tool_choice"] = choice
        body["parallel_tool_calls"] = not (req.tool_choice and req.tool_choice.disable_parallel_tool_use)
    if req.output_config is not None and req.output_config.format is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": req.output_config.format.schema_}}
    if req.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": req.thinking.type != "disabled"}
        if req.thinking.type == "enabled" and req.thinking.budget_tokens is not None:
            body["thinking_token_budget"] = req.thinking.budget_tokens
    return body


def parse_messages_request(body: Any, count_only: bool = False) -> tuple[MessagesRequest, api.GenerationRequest]:
    """The Messages request and the chat GenerationRequest it becomes; an APIError (400) for what either refuses."""
    req = api.validated(CountTokensRequest if count_only else MessagesRequest, body)
    return req, api.parse_chat_request(chat_request_body(req))
