"""What `tinyvllm list/ps/show` print, laid out as `ollama list/ps/show` lay it out."""
from __future__ import annotations

import datetime
import json
import re

_UNITS = ((10**12, "TB"), (10**9, "GB"), (10**6, "MB"), (10**3, "KB"))


def human_bytes(n: int) -> str:
    """Ollama's format.HumanBytes: decimal units, one decimal below 10 ('1.5 GB', '42 MB', '7 B')."""
    for scale, unit in _UNITS:
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 and value != int(value) else f"{int(value)} {unit}"
    return f"{n} B"


def parse_time(text: str) -> datetime.datetime | None:
    """An RFC 3339 time (nanosecond fractions too); None for an empty or unreadable one."""
    if not text:
        return None
    text = re.sub(r"(\.\d{6})\d+", r"\1", text.strip()).replace("Z", "+00:00")
    try:
        parsed = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.timezone.utc)


def human_duration(seconds: float) -> str:
    """Ollama's format.humanDuration."""
    if seconds < 1:
        return "Less than a second"
    if int(seconds) == 1:
        return "1 second"
    if seconds < 60:
        return f"{int(seconds)} seconds"
    minutes = int(seconds // 60)
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = round(seconds / 3600)
    if hours == 1:
        return "About an hour"
    for limit, divisor, unit in ((48, 1, "hours"), (24 * 14, 24, "days"), (24 * 60, 24 * 7, "weeks"),
                                 (24 * 730, 24 * 30, "months")):
        if hours < limit:
            return f"{hours // divisor} {unit}"
    return f"{int(seconds / 86400 / 365)} years"


def human_time(text: str, now: datetime.datetime | None = None, zero: str = "Never") -> str:
    """'2 weeks ago', '4 minutes from now', 'Forever' (more than 20 years ahead), as `ollama list/ps` print."""
    when = parse_time(text)
    if when is None:
        return zero
    delta = ((now or datetime.datetime.now(datetime.timezone.utc)) - when).total_seconds()
    if delta < -20 * 365 * 86400:
        return "Forever"
    return f"{human_duration(-delta)} from now" if delta < 0 else f"{human_duration(delta)} ago"


def table(headers: list[str], rows: list[list[str]], padding: int = 4, indent: str = "") -> str:
    """Left-aligned columns, each as wide as its widest cell plus padding; no trailing spaces."""
    all_rows = ([headers] if headers else []) + rows
    if not all_rows:
        return ""
    widths = [max(len(row[i]) if i < len(row) else 0 for row in all_rows) for i in range(max(map(len, all_rows)))]
    lines = []
    for row in all_rows:
        cells = [cell.ljust(widths[i] + padding) for i, cell in enumerate(row)]
        lines.append((indent + "".join(cells)).rstrip())
    return "\n".join(lines)


def short_id(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def list_table(models: list[dict], now: datetime.datetime | None = None) -> str:
    """`ollama list`: NAME, ID, SIZE, MODIFIED."""
    rows = [[m.get("name", ""), short_id(m.get("digest", "")), human_bytes(m.get("size", 0)),
             human_time(m.get("modified_at", ""), now)] for m in models]
    return table(["NAME", "ID", "SIZE", "MODIFIED"], rows)


def processor(size: int, size_vram: int) -> str:
    """Ollama's PROCESSOR column: where the model's memory is."""
    if size_vram == 0:
        return "100% CPU"
    if size_vram == size:
        return "100% GPU"
    if size_vram > size or size == 0:
        return "Unknown"
    cpu = round((size - size_vram) / size * 100)
    return f"{cpu}%/{100 - cpu}% CPU/GPU"


def ps_table(models: list[dict], now: datetime.datetime | None = None) -> str:
    """`ollama ps`: NAME, ID, SIZE, PROCESSOR, CONTEXT, UNTIL."""
    rows = []
    for m in models:
        size, vram = m.get("size", 0), m.get("size_vram", 0)
        until = human_time(m.get("expires_at", ""), now)
        rows.append([m.get("name", ""), short_id(m.get("digest", "")), human_bytes(size), processor(size, vram),
                     str(m.get("context_length", "")), "Stopping..." if until.endswith(" ago") else until])
    return table(["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"], rows)


def _number(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _head(text: str, n: int) -> list[list[str]]:
    """The first n non-empty lines (all if n < 0), then '...' if there were more."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    rows = [["", line] for line in (lines if n < 0 else lines[:n])]
    return rows + ([["", "..."]] if 0 <= n < len(lines) else [])


def show_text(reply: dict, verbose: bool = False) -> str:
    """`ollama show MODEL`: the Model, Capabilities, Parameters, System and License sections."""
    info, details = reply.get("model_info") or {}, reply.get("details") or {}
    arch = info.get("general.architecture") or details.get("family", "")
    model_rows = [["", "architecture", str(arch)],
                  ["", "parameters", details.get("parameter_size") or _number(info.get("general.parameter_count", ""))]]
    for key, label in (("context_length", "context length"), ("embedding_length", "embedding length")):
        if f"{arch}.{key}" in info:
            model_rows.append(["", label, _number(info[f"{arch}.{key}"])])
    model_rows.append(["", "quantization", details.get("quantization_level", "")])
    sections = [("Model", model_rows)]
    if reply.get("capabilities"):
        sections.append(("Capabilities", [["", c] for c in reply["capabilities"]]))
    if reply.get("parameters"):
        sections.append(("Parameters", [["", *line.split(None, 1)] for line in reply["parameters"].splitlines()
                                        if line.strip()]))
    for key, title in (("system", "System"), ("license", "License")):
        if reply.get(key):
            sections.append((title, _head(reply[key], -1 if verbose else 2)))
    if verbose and info:
        sections.append(("Metadata", [["", k, json.dumps(v) if isinstance(v, (list, dict)) else _number(v)]
                                      for k, v in sorted(info.items())]))
    return "\n".join(f"  {title}\n{table([], rows)}\n" for title, rows in sections)
