"""A Responses request, validated, and the chat request it becomes: `instructions` a system message, `input` (a
string, or items: messages, function_call, function_call_output; past reasoning items dropped) the messages, function
`tools` and `tool_choice` as chat's, `text.format` the response_format, `reasoning.effort` the template's
reasoning_effort (`none`: enable_thinking false), `max_output_tokens` max_tokens. With `previous_response_id`, the
stored conversation it names (store.py) comes before the input; without a store that is a 400."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api.request_models import RequestModel, Reworded
from tinyvllm.frontend.api.tool_calls import MAX_TOOLS

if TYPE_CHECKING:
    from tinyvllm.frontend.api.responses.store import ResponseStore


class InputTextPart(RequestModel):
    type: Literal["input_text", "output_text", "text"]
    text: str


class MessageItem(RequestModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Annotated[str | list[InputTextPart], Reworded(
        "{where} must be a string or a list of input_text parts (images and files are not supported: the model "
        "reads text)")]


class FunctionCallItem(RequestModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = "{}"


class FunctionCallOutputItem(RequestModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputTextPart]


class ReasoningItem(RequestModel):
    type: Literal["reasoning"]


InputItem = Annotated[FunctionCallItem | FunctionCallOutputItem | ReasoningItem | MessageItem, Reworded(
    "{where} must be a message, function_call, function_call_output or reasoning item")]


class ResponsesFunctionTool(RequestModel):
    type: Literal["function"]
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    strict: bool | None = None


class ResponsesNamedFunction(RequestModel):
    type: Literal["function"]
    name: str


class TextFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str = "output"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextOptions(RequestModel):
    format: TextFormat | None = None


class ReasoningOptions(RequestModel):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None


class ResponsesRequest(RequestModel):
    model: str | None = None
    input: Annotated[str | Annotated[list[InputItem], Field(min_length=1)], Reworded(
        "'input' must be a string or a non-empty list of items", when_missing=True)]
    instructions: str | None = None
    tools: Annotated[list[Annotated[ResponsesFunctionTool, Reworded(
        "{where}: only function tools are supported")]] | None, Field(max_length=MAX_TOOLS)] = None
    tool_choice: Literal["auto", "none", "required"] | ResponsesNamedFunction | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: Annotated[int | None, Field(ge=1)] = None
    temperature: Annotated[float | None, Field(ge=0, le=2)] = None
    top_p: Annotated[float | None, Field(gt=0, le=1)] = None
    stream: bool = False
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    previous_response_id: str | None = None
    store: bool | None = None  # None: stored when the server keeps a store (OpenAI's default is true)
    background: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None


def _text(content: str | list[InputTextPart]) -> str:
    return content if isinstance(content, str) else "\n".join(part.text for part in content)


def input_items(req: ResponsesRequest) -> list[InputItem]:
    return [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else list(req.input)


def _messages(instructions: str | None, items: list[InputItem]) -> list[dict]:
    out = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": "system" if item.role == "developer" else item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)  # a reply's parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
    return out


def chat_request_body(req: ResponsesRequest, items: list[InputItem]) -> dict:
    """items: the conversation, the earlier turns' (previous_response_id) then this input's."""
    body: dict[str, Any] = {"messages": _messages(req.instructions, items), "stream": req.stream,
                            "parallel_tool_calls": req.parallel_tool_calls}
    for name, value in (("model", req.model), ("max_tokens", req.max_output_tokens), ("temperature", req.temperature),
                        ("top_p", req.top_p)):
        if value is not None:
            body[name] = value
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.parameters}} for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice if isinstance(req.tool_choice, str) else {
            "type": "function", "function": {"name": req.tool_choice.name}}
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise api.APIError("text.format of type json_schema needs a schema", param="text.format.schema")
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_}}
    elif fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort in ("none", "minimal"):
        body["chat_template_kwargs"] = {"enable_thinking": False}
    elif effort is not None:
        body["reasoning_effort"] = effort
    return body


def parse_responses_request(body: Any, store: ResponseStore | None
                            ) -> tuple[ResponsesRequest, api.GenerationRequest, list[InputItem]]:
    """The request, the chat request it means and its conversation's items; store: the server's (None: it keeps
    none)."""
    req = api.validated(ResponsesRequest, body)
    history: list[InputItem] = []
    if req.previous_response_id is not None:
        if store is None:
            raise api.APIError("previous_response_id needs the response store, which this server does not keep "
                               "(--responses-store-size): send the whole conversation as input",
                               param="previous_response_id")
        previous = store.get(req.previous_response_id, param="previous_response_id")
        if previous.response["status"] != "completed" and previous.response["status"] != "incomplete":
            raise api.APIError(f"Response '{req.previous_response_id}' is {previous.response['status']}: only a "
                               "finished response can be continued", param="previous_response_id")
        history = previous.items
    if req.background and (store is None or req.store is False):
        raise api.APIError("background responses are kept in the response store: the server needs "
                           "--responses-store-size and the request must not set store false", param="background")
    items = history + input_items(req)
    return req, api.parse_chat_request(chat_request_body(req, items)), items
