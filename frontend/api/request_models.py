"""What every request model shares (pydantic v2): strict JSON types, null meaning "the default", one wording of
validation errors for both APIs, and the JSON schemas /openapi.json shows.

A request model is declared once, as a RequestModel subclass; `validate(Model, body)` checks a decoded JSON body
against it and raises RequestInvalid(message, param) worded as this server always worded its 400s. Fields whose
failures read better as one sentence (a union, a nested list) carry `Reworded(...)`; bounded fields whose vLLM
wording differs from the generic "must be in [lo, hi]" carry `OutOfRange(...)`.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticCustomError, core_schema

_REWORDED = "reworded"
_TYPE_WORDS = {"int_type": "an integer", "int_from_float": "an integer", "int_parsing": "an integer",
               "float_type": "a number", "float_parsing": "a number", "bool_type": "a boolean",
               "string_type": "a string", "list_type": "an array", "dict_type": "an object", "model_type": "an object",
               "model_attributes_type": "an object"}
_BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


class RequestModel(BaseModel):
    # strict: a JSON true is not 1 and "5" is not 5; unknown fields are accepted and ignored, as vLLM and Ollama do
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and None in data.values():
            return {k: v for k, v in data.items() if v is not None}
        return data


class RequestInvalid(ValueError):
    def __init__(self, message: str, param: str | None):
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True)
class Reworded:
    """Any failure of the annotated value reads `message` ({where}: the value's path, e.g. messages[0].content);
    a failure already reworded further in keeps its own words. when_missing: also when the field is absent."""
    message: str
    when_missing: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(self._validate, handler(source))

    def _validate(self, value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError as e:
            inner = [err for err in e.errors() if err["type"] == _REWORDED]
            if inner:  # e.g. a union's other branches failed too: only the reworded failure is kept
                raise ValidationError.from_exception_data(e.title, [
                    {"type": PydanticCustomError(_REWORDED, err["msg"]), "loc": err["loc"], "input": err["input"]}
                    for err in inner]) from None
            raise PydanticCustomError(_REWORDED, self.message) from None


@dataclass(frozen=True)
class OutOfRange:
    """How a bounded field's out-of-range value reads ({input} formats in), when not "{name} must be in [lo, hi]";
    above: a different wording for a value over the maximum."""
    message: str
    above: str | None = None


def validate(model: type[RequestModel], body: Any) -> RequestModel:
    """The decoded JSON body as `model`; RequestInvalid (the first problem, in this server's words) if it is not."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise RequestInvalid(*error_wording(model, e.errors()[0])) from None


def error_wording(model: type[BaseModel], error: Any) -> tuple[str, str | None]:
    """(message, param) for one pydantic error: param is the top-level field it concerns."""
    loc, kind, value = error["loc"], error["type"], error.get("input")
    if not loc:
        return "The request body must be a JSON object", None
    name = str(loc[0])
    where = "".join(map(_path_part, loc)).lstrip(".")
    field = model.model_fields.get(name)
    metadata = field.metadata if field is not None else []
    reworded = next((m for m in metadata if isinstance(m, Reworded)), None)
    if kind == _REWORDED:
        return error["msg"].replace("{where}", where), name
    if kind == "missing":
        return (reworded.message if reworded and reworded.when_missing else f"'{where}' is required"), name
    if kind in _BOUND_ERRORS:
        return _out_of_range(where, value, metadata if len(loc) == 1 else [], error), name
    if kind == "finite_number" or kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        return f"'{where}' must be a finite number", name  # an integer literal too large for a float
    if kind in _TYPE_WORDS:
        return f"'{where}' must be {_TYPE_WORDS[kind]}, got {value!r:.100}", name
    if kind == "literal_error":
        return f"'{where}' must be one of {error['ctx']['expected']}, got {value!r:.50}", name
    if kind == "too_short":
        return f"'{where}' must not be empty", name
    return f"'{where}': {error['msg']}", name


def _path_part(part: str | int) -> str:
    """messages[0].content, logit_bias['5']: a field name after a dot, a list index or a dict key in brackets."""
    if isinstance(part, int):
        return f"[{part}]"
    return f".{part}" if part.isidentifier() else f"[{part!r}]"


def _out_of_range(name: str, value: Any, metadata: list, error: Any) -> str:
    """vLLM's wording: "{name} must be in [lo, hi], got {value}." (or the field's OutOfRange)."""
    wording = next((m for m in metadata if isinstance(m, OutOfRange)), None)
    if wording is not None:
        return (wording.above if wording.above and error["type"].startswith("less") else wording.message).format(
            input=value)
    # a top-level field: both its bounds; a nested value: the one it broke
    bounds = {b: getattr(m, b) for m in metadata for b in ("ge", "gt", "le", "lt") if hasattr(m, b)} or error["ctx"]
    low = f"[{bounds['ge']}" if "ge" in bounds else f"({bounds['gt']}" if "gt" in bounds else None
    high = f"{bounds['le']}]" if "le" in bounds else f"{bounds['lt']})" if "lt" in bounds else None
    if low and high:
        return f"{name} must be in {low}, {high}, got {value}."
    if low:
        return f"{name} must be greater than {'or equal to ' if low[0] == '[' else ''}{low[1:]}, got {value}."
    return f"{name} must be less than {'or equal to ' if high[-1] == ']' else ''}{high[:-1]}, got {value}."


class _Schema(GenerateJsonSchema):
    """Request schemas leave out `null` (it means the default, and a fuzzer's nulls test nothing) and per-field
    titles; responses keep their nulls. (Response schemas come from plain pydantic models, mode "serialization".)"""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> dict:
        if self.mode == "validation":
            return self.generate_inner(schema["schema"])
        return super().nullable_schema(schema)

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> dict:
        if self.mode == "validation" and schema.get("default", ...) is None:
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def json_schema(model: type[BaseModel], mode: str = "validation") -> tuple[dict, dict]:
    """(the model's JSON schema, the schemas it refers to by #/components/schemas/<name>): a copy to keep."""
    schema = copy.deepcopy(_json_schema(model, mode))
    return schema, schema.pop("$defs", {})


@functools.cache
def _json_schema(model: type[BaseModel], mode: str) -> dict:
    return model.model_json_schema(mode=mode, schema_generator=_Schema, ref_template="#/components/schemas/{model}")
