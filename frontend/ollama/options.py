"""Ollama `options` (and Modelfile PARAMETERs) -> our SamplingParams, max_tokens and stop strings.

Defaults are Ollama's (temperature 0.8, top_k 40, top_p 0.9, num_predict -1 = until the context ends).
Load-time and hardware options (num_ctx, num_gpu, num_thread, ...) and samplers we do not have (mirostat,
typical_p, tfs_z) are accepted and ignored, as Ollama ignores options its engine lacks; unknown keys too.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import sys
from dataclasses import dataclass
from typing import Any

from tinyvllm.protocol.sampling import SamplingParams

log = logging.getLogger(__name__)

DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
# Ollama option -> (its type, our SamplingParams field, the value that changes nothing)
SAMPLER_OPTIONS = {
    "temperature": (float, "temperature", None), "top_p": (float, "top_p", None), "top_k": (int, "top_k", None),
    "min_p": (float, "min_p", 0.0), "repeat_penalty": (float, "repetition_penalty", 1.0),
    "presence_penalty": (float, "presence_penalty", 0.0), "frequency_penalty": (float, "frequency_penalty", 0.0),
}
OTHER_OPTIONS = {"seed": int, "num_predict": int, "stop": list}
IGNORED_OPTIONS = {
    "num_ctx": int, "num_keep": int, "repeat_last_n": int, "typical_p": float, "tfs_z": float, "mirostat": int,
    "mirostat_tau": float, "mirostat_eta": float, "penalize_newline": bool, "numa": bool, "num_batch": int,
    "num_gpu": int, "main_gpu": int, "low_vram": bool, "f16_kv": bool, "logits_all": bool, "vocab_only": bool,
    "use_mmap": bool, "use_mlock": bool, "embedding_only": bool, "num_thread": int,
}
_TYPE_WORDS = {int: "an integer", float: "a number", bool: "a boolean", list: "a list of strings"}


class OptionError(ValueError):
    pass


@dataclass
class GenerationSettings:
    sampling: SamplingParams
    max_tokens: int | None  # None: until the context ends
    stop: list[str]


def option_type(name: str) -> type | None:
    if name in SAMPLER_OPTIONS:
        return SAMPLER_OPTIONS[name][0]
    return OTHER_OPTIONS.get(name) or IGNORED_OPTIONS.get(name)


def _checked(name: str, value: Any, kind: type) -> Any:
    if kind is list:
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise OptionError(f"option '{name}' must be {_TYPE_WORDS[list]}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise OptionError(f"option '{name}' must be {_TYPE_WORDS[bool]}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise OptionError(f"option '{name}' must be {_TYPE_WORDS[kind]}, got {value!r:.50}")
    if isinstance(value, float) and math.isinf(value) or kind is float and abs(value) > sys.float_info.max:
        raise OptionError(f"option '{name}' must be a finite number, got {value!r:.50}")
    if kind is int:
        if value != int(value):
            raise OptionError(f"option '{name}' must be {_TYPE_WORDS[int]}, got {value!r}")
        return int(value)
    return float(value)


def check_options(options: Any, where: str = "options") -> dict:
    """Type-checks known options (unknown ones are dropped with a log line); returns the known ones."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise OptionError(f"'{where}' must be an object")
    checked = {}
    for name, value in options.items():
        kind = option_type(name)
        if kind is None:
            log.warning("ignoring unknown option %r", name)
        elif value is not None:
            checked[name] = _checked(name, value, kind)
    return checked


def coerce_parameter(name: str, text: str) -> Any:
    """A Modelfile `PARAMETER name value` value, typed; `stop` gives one string (PARAMETER stop may repeat)."""
    kind = option_type(name)
    if kind is None:
        raise OptionError(f"unknown parameter '{name}'")
    if kind is list:
        return text
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise OptionError(f"parameter '{name}' must be true or false, got {text!r}")
        return text.lower() == "true"
    try:
        return _checked(name, float(text) if kind is float else int(text), kind)
    except ValueError:
        raise OptionError(f"parameter '{name}' must be {_TYPE_WORDS[kind]}, got {text!r}") from None


def generation_settings(model_parameters: dict, options: Any) -> GenerationSettings:
    """The model's PARAMETERs, overridden by the request's options."""
    merged = {**DEFAULTS, **model_parameters, **check_options(options)}
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    kwargs: dict[str, Any] = {}
    for name, (_, target, neutral) in SAMPLER_OPTIONS.items():
        if name not in merged:
            continue
        if target in fields:
            kwargs[target] = merged[name]
        elif merged[name] != neutral:
            raise OptionError(f"option '{name}' is not supported by this server yet")
    seed = merged.get("seed")
    kwargs["seed"] = seed if seed is not None and seed >= 0 else None  # Ollama: -1 = a random seed
    num_predict = merged.get("num_predict", -1)
    max_tokens = num_predict if num_predict > 0 else None  # -1 (and -2, 0): until the context ends
    sampling = SamplingParams(**kwargs, max_tokens=max_tokens or 1)
    try:
        sampling.validate()
    except ValueError as e:
        raise OptionError(str(e)) from None
    stop = merged.get("stop", [])
    return GenerationSettings(sampling, max_tokens, [s for s in stop if s])
