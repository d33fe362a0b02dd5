"""Tool calling in the Hermes format most open chat templates use (Qwen2.5/3, Hermes, SmolLM3, ...): the model
writes each call as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.

- `check_tools`: OpenAI's `tools` (and Ollama's, the same shape), checked: a 400 names what is wrong.
- `forced_grammar`: tool_choice "required" or a named function -> an llguidance grammar (frontend/structured_output.py
  carries grammars to the sampling worker) allowing only calls whose JSON validates against the functions' schemas.
- `tool_preamble`: the tools described in a system message, for a chat template that ignores `tools`.
- `parse_tool_calls`: a finished text -> (the content before the calls, the calls), for tool_choice "auto" too.
"""
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

from tinyvllm.frontend.structured_output import GrammarInvalid, _checked

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(CALL_CLOSE), re.DOTALL)
MAX_TOOLS = 128


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


def forced_grammar(functions: list[dict], single: bool = False) -> str:
    """A grammar for one or more (single: exactly one) calls of `functions`, arguments valid against their schemas."""
    call = {"anyOf": [{"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": fn["parameters"]},
                       "required": ["name", "arguments"], "additionalProperties": False} for fn in functions]}
    lark = (f"start: call{'' if single else '+'}\n"
            f"call: {json.dumps(CALL_OPEN + chr(10))} body {json.dumps(chr(10) + CALL_CLOSE + chr(10))}\n"
            f"body: %json {json.dumps(call)}\n")
    try:
        grammar = LLMatcher.grammar_from_lark(lark)
    except ValueError as e:
        raise GrammarInvalid(f"tools: a function's parameters are not a usable JSON schema: {e}", "tools") from None
    return _checked(grammar, "tools")


def tool_preamble(functions: list[dict]) -> str:
    """What a template without tool support is told (Hermes's wording), as a system message."""
    signatures = "\n".join(json.dumps({"type": "function", "function": fn}) for fn in functions)
    return ("You are a function calling AI model. You are provided with function signatures within <tools></tools> "
            "XML tags. You may call one or more functions to assist with the user query. For each function call, "
            "return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
            f"<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>\n"
            f"<tools>\n{signatures}\n</tools>")


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the text before the first call, stripped; the calls whose JSON parses into a name and an arguments object).
    Text with no well-formed call is all content."""
    calls = []
    for m in _CALL_RE.finditer(text):
        try:
            body = json.loads(m.group(1))
        except ValueError:
            continue
        if isinstance(body, dict) and isinstance(body.get("name"), str) and isinstance(body.get("arguments", {}), dict):
            calls.append(ToolCall(body["name"], json.dumps(body.get("arguments", {})), f"call_{uuid.uuid4().hex[:24]}"))
    if not calls:
        return text, []
    return text[:text.index(CALL_OPEN)].strip(), calls
