"""Tool calling in the Hermes format most open chat templates use (Qwen2.5/3, Hermes, SmolLM3, ...): the model
writes each call as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.

- `check_tools`: OpenAI's `tools` (and Ollama's, the same shape), checked: a 400 names what is wrong.
- `forced_grammar`: tool_choice "required" or a named function -> an llguidance grammar
  (frontend/api/structured_output.py carries grammars to the sampling worker) allowing only calls whose JSON
  validates against the functions' schemas.
- `tool_preamble`: the tools described in a system message, for a chat template that ignores `tools`.
- `parse_tool_calls`: a finished text -> (the content before the calls, the calls), for tool_choice "auto" too;
  `ToolCallText` does it for a streamed text, holding back what may be the start of a call.
- `chat_tools`: a chat request's tools and tool_choice -> ChatTools (the tools the template sees, the grammar that
  forces calls, whether to parse calls); `template_messages`: the messages and tools as the chat template takes them.
"""
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

from tinyvllm.frontend.api.structured_output import GrammarInvalid, _checked

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(CALL_CLOSE), re.DOTALL)
MAX_TOOLS = 128
# where a JSON schema holds subschemas: maps of them, and single ones or lists of them
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("items", "prefixItems", "additionalItems", "anyOf", "oneOf", "allOf", "not", "if", "then", "else",
               "contains", "additionalProperties", "unevaluatedProperties", "propertyNames")
# as Hermes-format models write calls, and no room for endless whitespace
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI returns it
    id: str

    def openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}

    def ollama(self) -> dict:
        return {"function": {"name": self.name, "arguments": json.loads(self.arguments)}}


@dataclass(frozen=True)
class ChatTools:
    functions: list[dict]  # what the prompt describes (none for tool_choice "none")
    grammar: str | None  # forces calls: tool_choice "required" or a named function
    parse: bool  # the reply's calls become tool_calls


NO_TOOLS = ChatTools([], None, False)


def chat_tools(tools: Any, tool_choice: Any, parallel_tool_calls: bool = True) -> ChatTools:
    """OpenAI's tools and tool_choice (default "auto" with tools, "none" without), checked."""
    functions = check_tools(tools if tools is not None else [])
    if tool_choice is None:
        tool_choice = "auto" if functions else "none"
    if isinstance(tool_choice, str) and tool_choice not in ("none", "auto", "required"):
        raise GrammarInvalid("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                             "\"function\": {\"name\": ...}}", "tool_choice")
    if tool_choice == "none" or not functions and tool_choice == "auto":
        return NO_TOOLS
    forced = chosen_functions(functions, tool_choice)
    grammar = forced_grammar(forced, single=tool_choice != "required" or not parallel_tool_calls) if forced else None
    return ChatTools(functions, grammar, True)


def check_tools(tools: Any, param: str = "tools") -> list[dict]:
    """The tools' functions ({"name", "description", "parameters"}), or GrammarInvalid (-> 400) naming the problem."""
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise GrammarInvalid(f"{param} must be a list of at most {MAX_TOOLS} tools", param)
    functions, names = [], set()
    for i, tool in enumerate(tools):
        where = f"{param}[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or \
                not isinstance(tool.get("function"), dict):
            raise GrammarInvalid(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}", where)
        fn = tool["function"]
        name, parameters = fn.get("name"), fn.get("parameters", {"type": "object"})
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise GrammarInvalid(f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-'", where)
        if name in names:
            raise GrammarInvalid(f"{where}.function.name {name!r} is given twice", where)
        if not isinstance(parameters, dict):
            raise GrammarInvalid(f"{where}.function.parameters must be a JSON schema (an object)", where)
        names.add(name)
        functions.append({"name": name, "description": fn.get("description", ""), "parameters": parameters})
    return functions


def chosen_functions(functions: list[dict], tool_choice: Any) -> list[dict] | None:
    """The functions a call is forced to (tool_choice "required": any; {"type": "function", "function": {"name"}}:
    that one), or None when the model chooses ("auto") or may not call ("none")."""
    if tool_choice in (None, "auto", "none"):
        return None
    if tool_choice == "required":
        if not functions:
            raise GrammarInvalid("tool_choice 'required' needs tools", "tool_choice")
        return functions
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    chosen = [fn for fn in functions if fn["name"] == name]
    if not chosen:
        raise GrammarInvalid(f"tool_choice names no function of the tools: {tool_choice!r}", "tool_choice")
    return chosen


def closed(schema: Any) -> Any:
    """schema with every object that lists its properties closed to others (additionalProperties false where it
    says nothing), as OpenAI's strict function calling and xgrammar's strict mode take it: a call names the
    arguments its function has, and a forced call cannot ramble on in made-up keys. Only subschemas change, never
    values (const, enum, default, examples)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMAS:
        if key in out:
            out[key] = closed(out[key])
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def forced_grammar(functions: list[dict], single: bool = False) -> str:
    """A grammar for one or more (single: exactly one) calls of `functions`, arguments valid against their schemas
    (closed to made-up keys)."""
    call = {"x-guidance": _JSON_LAYOUT, "anyOf": [
        {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": closed(fn["parameters"])},
         "required": ["name", "arguments"], "additionalProperties": False} for fn in functions]}
    lark = (f"start: call{'' if single else '+'}\n"
            f"call: {json.dumps(CALL_OPEN + chr(10))} body {json.dumps(chr(10) + CALL_CLOSE + chr(10))}\n"
            f"body: %json {json.dumps(call)}\n")
    try:
        grammar = LLMatcher.grammar_from_lark(lark)
    except ValueError as e:
        raise GrammarInvalid(f"tools: a function's parameters are not a usable JSON schema: {e}", "tools") from None
    return _checked(grammar, "tools")


def message_dict(role: str, content: str, tool_calls: list[dict] | None = None, **fields: str | None) -> dict:
    """A chat message as templates take it: `tool_calls` ({"function": {"name", "arguments": an object}}) only when
    there are some, and each other field (tool_call_id, name) only when set: templates test for the keys."""
    message = {"role": role, "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message | {key: value for key, value in fields.items() if value is not None}


def call_text(name: str, arguments: Any) -> str:
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CALL_CLOSE}"


def template_messages(messages: list[dict], functions: list[dict], chat_template: str | None) -> tuple[list, dict]:
    """(messages, extra template variables) for a chat with tools or tool messages. A template that knows tools
    (it mentions them) gets them as `tools` and renders calls and results itself; any other gets the tools in the
    system message (tool_preamble) and the calls and results as Hermes text."""
    if chat_template and "tools" in chat_template:
        return messages, {"tools": [{"type": "function", "function": fn} for fn in functions]} if functions else {}
    rendered = []
    for m in messages:
        content = m["content"]
        if m["role"] == "tool":
            rendered.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
            continue
        if calls := m.get("tool_calls"):
            texts = [call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls]
            content = "\n".join(([content] if content else []) + texts)
        rendered.append({"role": m["role"], "content": content})
    if functions:
        preamble = tool_preamble(functions)
        if rendered and rendered[0]["role"] == "system":
            rendered[0] = {"role": "system", "content": f"{rendered[0]['content']}\n\n{preamble}"}
        else:
            rendered.insert(0, {"role": "system", "content": preamble})
    return rendered, {}


def tool_preamble(functions: list[dict]) -> str:
    """What a template without tool support is told (Hermes's wording), as a system message."""
    signatures = "\n".join(json.dumps({"type": "function", "function": fn}) for fn in functions)
    return ("You are a function calling AI model. You are provided with function signatures within <tools></tools> "
            "XML tags. You may call one or more functions to assist with the user query. For each function call, "
            "return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
            f"<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>\n"
            f"<tools>\n{signatures}\n</tools>")


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the text before the first call, less trailing whitespace; the calls whose JSON parses into a name and an
    arguments object, or a list of those).
    Text with no well-formed call is all content."""
    calls = []
    for m in _CALL_RE.finditer(text):
        try:
            body = json.loads(m.group(1))
        except ValueError:
            continue
        for call in body if isinstance(body, list) else [body]:  # some models (SmolLM2) write a list of calls
            if isinstance(call, dict) and isinstance(call.get("name"), str) and \
                    isinstance(call.get("arguments", {}), dict):
                calls.append(ToolCall(call["name"], json.dumps(call.get("arguments", {})),
                                      f"call_{uuid.uuid4().hex[:24]}"))
    if not calls:
        return text, []
    return text[:text.index(CALL_OPEN)].rstrip(), calls


class ToolCallText:
    """One streamed reply with its calls taken out: the text before the first call streams as content, holding back
    a tail that may be the start of one; from the first call on the text is kept, and parsed when it ends."""

    def __init__(self):
        self.held, self.calls_text = "", None

    def feed(self, text: str) -> str:
        """The content that may be shown now."""
        if self.calls_text is not None:
            self.calls_text += text
            return ""
        text = self.held + text
        if (start := text.find(CALL_OPEN)) >= 0:
            shown = text[:start].rstrip()
            self.calls_text, self.held = text[len(shown):], ""
            return shown
        keep = next((k for k in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1) if CALL_OPEN.startswith(text[-k:])),
                    0)
        shown = text[:len(text) - keep].rstrip()  # whitespace before a call is not content either
        self.held = text[len(shown):]
        return shown

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The content still held back, and the calls (none if what looked like a call does not parse)."""
        if self.calls_text is None:
            return self.held, []
        _, calls = parse_tool_calls(self.calls_text)
        return ("", calls) if calls else (self.calls_text, [])
