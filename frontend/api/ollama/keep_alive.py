"""Ollama's `keep_alive`: how long a model stays loaded after a request, as Ollama reads it.

A number is seconds; a string is a Go duration ("5m", "1h30m", "10s", "250ms") or a number of seconds ("300");
0 unloads the model as soon as its requests are done; any negative value keeps it loaded forever. The server's
default is `--keep-alive`, else the OLLAMA_KEEP_ALIVE environment variable, else 5 minutes.
"""
import math
import re

DEFAULT = "5m"
ENV = "OLLAMA_KEEP_ALIVE"
FOREVER = math.inf
FOREVER_FROM_S = 1e9  # ~32 years: longer is forever (and stays a date /api/ps can write)
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")


class KeepAliveInvalid(ValueError):
    pass


def keep_alive_seconds(value: str | float | int) -> float:
    """Seconds a model stays loaded after its last request; FOREVER for a negative value. KeepAliveInvalid if
    `value` is neither a number nor a duration."""
    if isinstance(value, bool):
        raise KeepAliveInvalid(f"keep_alive must be a duration or a number of seconds, not {value!r}")
    if isinstance(value, float) and math.isnan(value):
        raise KeepAliveInvalid("keep_alive must be a duration or a number of seconds, not NaN")
    if isinstance(value, int | float):
        seconds = float(value) if abs(value) < FOREVER_FROM_S else (-1.0 if value < 0 else FOREVER_FROM_S)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            seconds = _duration_seconds(text)
    if math.isnan(seconds):
        raise KeepAliveInvalid("keep_alive must be a duration or a number of seconds, not NaN")
    return FOREVER if seconds < 0 or seconds >= FOREVER_FROM_S else seconds


def _duration_seconds(text: str) -> float:
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.removeprefix("+"))
    parts = _PART.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise KeepAliveInvalid(f"keep_alive must be a duration (such as 5m, 1h30m or 10s) or a number of seconds, "
                               f"not {text!r}")
    return sign * sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def is_unload(value) -> bool:
    """Whether keep_alive asks for the model to be unloaded at once (0, "0", "0s", ...)."""
    if value is None:
        return False
    try:
        return keep_alive_seconds(value) == 0
    except KeepAliveInvalid:
        return False
