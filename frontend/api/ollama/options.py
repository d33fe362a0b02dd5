"""Ollama `options` (and Modelfile PARAMETERs) -> our SamplingParams, max_tokens and stop strings.

Defaults are Ollama's (temperature 0.8, top_k 40, top_p 0.9, num_predict -1 = until the context ends).
Load-time and hardware options (num_ctx, num_gpu, num_thread, ...) and samplers we do not have (mirostat,
typical_p, tfs_z) are accepted and ignored, as Ollama ignores options its engine lacks; unknown keys too.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, create_model

from tinyvllm.frontend.api.request_models import RequestInvalid, RequestModel, Reworded, validate
from tinyvllm.protocol.sampling import SamplingParams

log = logging.getLogger(__name__)

DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
# Ollama sampler option -> (our SamplingParams field, the value that changes nothing)
SAMPLER_OPTIONS = {
    "temperature": ("temperature", None), "top_p": ("top_p", None), "top_k": ("top_k", None),
    "min_p": ("min_p", 0.0), "repeat_penalty": ("repetition_penalty", 1.0),
    "presence_penalty": ("presence_penalty", 0.0), "frequency_penalty": ("frequency_penalty", 0.0),
}


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Ollama's options are Go numbers: 8.0 is an integer option's 8
Int = Annotated[int, BeforeValidator(_integral, json_schema_input_type=int)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
IGNORED_OPTIONS = {  # load-time and hardware options, and samplers we do not have
    "num_ctx": Int, "num_keep": Int, "repeat_last_n": Int, "typical_p": float, "tfs_z": float, "mirostat": Int,
    "mirostat_tau": float, "mirostat_eta": float, "penalize_newline": bool, "numa": bool, "num_batch": Int,
    "num_gpu": Int, "main_gpu": Int, "low_vram": bool, "f16_kv": bool, "logits_all": bool, "vocab_only": bool,
    "use_mmap": bool, "use_mlock": bool, "embedding_only": bool, "num_thread": Int,
}


class OptionError(ValueError):
    pass


class SamplerOptions(RequestModel):
    model_config = ConfigDict(extra="allow")  # unknown options are logged, then ignored

    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[Int, Field(ge=-1, le=2**31 - 1, description="0 or -1: off")] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[float, Field(gt=0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Annotated[Int, Field(le=2**63 - 1, description="negative: a random seed")] | None = None
    num_predict: Annotated[Int | None, Field(description="at most this many tokens; 0 or less: until the context "
                                                         "ends")] = None
    stop: Annotated[list[str], BeforeValidator(lambda v: [v] if isinstance(v, str) else v,
                                               json_schema_input_type=str | list[str]),
                    Reworded("'stop' must be a string or a list of strings")] | None = None


OllamaOptions = create_model("OllamaOptions", __base__=SamplerOptions, __doc__="Ollama's options; load-time, hardware "
                             "and unknown ones are accepted and ignored.",
                             **{name: (kind | None, Field(None, description="ignored"))
                                for name, kind in IGNORED_OPTIONS.items()})
OPTION_NAMES = frozenset(OllamaOptions.model_fields)


@dataclass
class GenerationSettings:
    sampling: SamplingParams
    max_tokens: int | None  # None: until the context ends
    stop: list[str]


def check_options(options: Any) -> dict:
    """The options that are set, type-checked (unknown ones are dropped with a log line)."""
    if options is None:
        return {}
    try:
        checked = validate(OllamaOptions, options)
    except RequestInvalid as e:
        raise OptionError(e.message) from None
    for name in checked.model_extra or {}:
        log.warning("ignoring unknown option %r", name)
    return {name: getattr(checked, name) for name in checked.model_fields_set if name in OPTION_NAMES}


def coerce_parameter(name: str, text: str) -> Any:
    """A Modelfile `PARAMETER name value` value, typed; `stop` gives one string (PARAMETER stop may repeat)."""
    if name not in OPTION_NAMES:
        raise OptionError(f"unknown parameter '{name}'")
    return text if name == "stop" else check_options({name: _scalar(text)})[name]


def _scalar(text: str) -> Any:
    """true/false, an integer or a number; the text itself (for the option's type check to refuse) otherwise."""
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def generation_settings(model_parameters: dict, options: Any) -> GenerationSettings:
    """The model's PARAMETERs, overridden by the request's options."""
    merged = {**DEFAULTS, **model_parameters, **check_options(options)}
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    kwargs: dict[str, Any] = {}
    for name, (target, neutral) in SAMPLER_OPTIONS.items():
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
