"""Ollama model names: `[host/][namespace/]model[:tag]`, the tag defaulting to `latest`, matched case-insensitively."""
import re

_PART = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"
_NAME_RE = re.compile(rf"{_PART}(?:/{_PART}){{0,2}}(?::{_PART})?")
PATTERN = f"^{_NAME_RE.pattern}$"  # a valid name, for JSON schemas (is_valid also allows surrounding spaces)


def full_name(name: str) -> str:
    """'llama3' -> 'llama3:latest'; a name that already has a tag is kept."""
    name = name.strip()
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:latest"


def is_valid(name: str) -> bool:
    return bool(_NAME_RE.fullmatch(name.strip()))


def key(name: str) -> str:
    """What two names must share to be the same model."""
    return full_name(name).casefold()


def short_name(name: str) -> str:
    """The OpenAI-style id: the tag dropped when it is `latest`."""
    name = full_name(name)
    return name[: -len(":latest")] if name.endswith(":latest") else name
