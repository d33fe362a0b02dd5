"""--speculative-config, spelled as vLLM's SpeculativeConfig (a JSON object): which proposer drafts tokens and how
many. Only "ngram" (prompt lookup: no draft model) is supported so far."""
import json
from dataclasses import dataclass

SUPPORTED_METHODS = ("ngram",)
_FIELDS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 3  # drafts proposed per decoding request and step
    # n-gram lookup: the longest and shortest suffix of the request's tokens matched against its earlier tokens
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2

    def __post_init__(self) -> None:
        if self.method not in SUPPORTED_METHODS:
            raise ValueError(f"speculative method {self.method!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED_METHODS)}")
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be at least 1")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min and prompt_lookup_max must satisfy 1 <= min <= max")


def parse_speculative_config(text: str | dict | None) -> SpeculativeConfig | None:
    """The --speculative-config JSON (or its dict) -> a SpeculativeConfig (None for no speculation); ValueError if
    it is wrong."""
    if not text:
        return None
    try:
        fields = dict(text) if isinstance(text, dict) else json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config is not JSON: {e}") from None
    if not isinstance(fields, dict):
        raise ValueError("--speculative-config must be a JSON object")
    if unknown := set(fields) - set(_FIELDS):
        raise ValueError(f"--speculative-config: unknown field(s) {', '.join(sorted(unknown))}; known: "
                         f"{', '.join(_FIELDS)}")
    if "method" not in fields:
        raise ValueError(f"--speculative-config needs a method (supported: {', '.join(SUPPORTED_METHODS)})")
    if "prompt_lookup_max" in fields and "prompt_lookup_min" not in fields:  # vLLM: one given sets both
        fields["prompt_lookup_min"] = min(fields["prompt_lookup_max"], 2)
    if "prompt_lookup_min" in fields and "prompt_lookup_max" not in fields:
        fields["prompt_lookup_max"] = max(fields["prompt_lookup_min"], 4)
    try:
        return SpeculativeConfig(**fields)
    except TypeError as e:
        raise ValueError(f"--speculative-config: {e}") from None
