"""Structured output: what a request asks for (OpenAI's response_format, vLLM's structured_outputs and guided_*,
Ollama's format) -> one llguidance grammar, as the JSON string SamplingParams.grammar carries to the worker, which
compiles it once per request and masks the logits with it at every step (workers/sampling_masks.py).

Each grammar is checked here, when the request arrives, so a broken schema, regex or grammar is a 400 that names
the problem instead of a failure in the worker.
"""
import json
from typing import Any

from llguidance import LLMatcher
from llguidance.gbnf_to_lark import any_to_lark

from tinyvllm.protocol.sampling import MAX_GRAMMAR_CHARS

# key and item separators without newlines: a model cannot pad the output with whitespace forever
_JSON_OPTIONS = {"whitespace_flexible": False}


class GrammarInvalid(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


def _bounded(text: str, param: str) -> str:
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarInvalid(f"{param} is too long: {len(text)} characters, at most {MAX_GRAMMAR_CHARS}", param)
    return text


def _checked(grammar: str, param: str) -> str:
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarInvalid(f"{param} is invalid: {error}", param)
    return _bounded(grammar, param)


def json_schema_grammar(schema: Any, param: str) -> str:
    """A JSON schema (an object, or its text) -> a grammar for JSON values that validate against it."""
    if isinstance(schema, str):
        try:
            schema = json.loads(_bounded(schema, param))
        except ValueError as e:
            raise GrammarInvalid(f"{param} is not valid JSON: {e}", param) from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarInvalid(f"{param} must be a JSON schema (an object)", param)
    text = _bounded(json.dumps(schema), param)
    try:
        grammar = LLMatcher.grammar_from_json_schema(text, defaults=_JSON_OPTIONS)
    except ValueError as e:
        raise GrammarInvalid(f"{param} is invalid: {e}", param) from None
    return _checked(grammar, param)


def json_object_grammar(param: str) -> str:
    return json_schema_grammar({"type": "object"}, param)


def regex_grammar(regex: str, param: str) -> str:
    return _checked(LLMatcher.grammar_from_regex(_bounded(regex, param)), param)


def choice_grammar(choices: list[str], param: str) -> str:
    if not choices:
        raise GrammarInvalid(f"{param} must list at least one choice", param)
    _bounded(json.dumps(choices), param)
    return _checked(LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices)), param)


def lark_or_gbnf_grammar(grammar: str, param: str) -> str:
    """A Lark grammar, or a GBNF/EBNF one (llama.cpp's), converted to Lark."""
    try:
        lark = any_to_lark(_bounded(grammar, param))
    except Exception as e:  # the converter raises whatever its parser meets
        raise GrammarInvalid(f"{param} is invalid: {e}", param) from None
    return _checked(LLMatcher.grammar_from_lark(lark), param)


def _response_format(value: dict) -> str | None:
    kind = value.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return json_object_grammar("response_format")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise GrammarInvalid("response_format.json_schema must be an object with a 'schema'",
                                 "response_format")
        return json_schema_grammar(spec["schema"], "response_format.json_schema.schema")
    raise GrammarInvalid(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                         "response_format")


def _structured_outputs(value: dict) -> str | None:
    """vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object."""
    given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if value.get(k) not in (None, False)]
    if len(given) > 1:
        raise GrammarInvalid(f"structured_outputs takes one constraint, got {', '.join(given)}", "structured_outputs")
    if not given:
        return None
    kind, spec = given[0], value[given[0]]
    return _one_constraint(kind, spec, f"structured_outputs.{kind}")


def _one_constraint(kind: str, spec: Any, param: str) -> str:
    if kind == "json":
        return json_schema_grammar(spec, param)
    if kind == "json_object":
        return json_object_grammar(param)
    if kind == "choice":
        if not isinstance(spec, list) or not all(isinstance(c, str) for c in spec):
            raise GrammarInvalid(f"{param} must be a list of strings", param)
        return choice_grammar(spec, param)
    if not isinstance(spec, str):
        raise GrammarInvalid(f"{param} must be a string", param)
    return regex_grammar(spec, param) if kind == "regex" else lark_or_gbnf_grammar(spec, param)


def openai_grammar(response_format: dict | None, structured_outputs: dict | None, guided: dict[str, Any]) -> str | None:
    """The grammar of an OpenAI-style request, or None. guided: vLLM's older guided_json / guided_regex /
    guided_choice / guided_grammar fields, by kind ("json", "regex", "choice", "grammar"), None where not given."""
    asked = {f"guided_{k}": v for k, v in guided.items() if v is not None}
    if response_format is not None and response_format.get("type") not in (None, "text"):
        asked["response_format"] = response_format
    if structured_outputs:
        asked["structured_outputs"] = structured_outputs
    if len(asked) > 1:
        raise GrammarInvalid(f"only one structured output constraint per request, got {', '.join(asked)}",
                             sorted(asked)[0])
    if not asked:
        return None
    name, value = next(iter(asked.items()))
    if name == "response_format":
        return _response_format(value)
    if name == "structured_outputs":
        return _structured_outputs(value)
    return _one_constraint(name.removeprefix("guided_"), value, name)


def ollama_grammar(fmt: Any) -> str | None:
    """Ollama's format: "" (none), "json" (any JSON object) or a JSON schema."""
    if fmt in ("", None):
        return None
    return json_object_grammar("format") if fmt == "json" else json_schema_grammar(fmt, "format")
