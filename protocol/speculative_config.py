"""--speculative-config, spelled as vLLM's SpeculativeConfig (a JSON object): which proposer drafts tokens and how
many. "ngram": prompt lookup (no draft model); "draft_model": a smaller model with the target's tokenizer, named by
`model` (a .gguf file or a Hugging Face folder), proposes its greedy tokens (workers/draft_model.py)."""
import dataclasses
from dataclasses import dataclass

from tinyvllm.protocol.knobs import parse_json_object
from tinyvllm.protocol.sampling import SamplingParams

SUPPORTED_METHODS = ("ngram", "draft_model")
_FIELDS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 3  # drafts proposed per decoding request and step
    # n-gram lookup: the longest and shortest suffix of the request's tokens matched against its earlier tokens
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    model: str | None = None  # draft_model: the draft's path (the launcher resolves it)

    def __post_init__(self) -> None:
        if self.method not in SUPPORTED_METHODS:
            raise ValueError(f"speculative method {self.method!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED_METHODS)}")
        if (self.method == "draft_model") != bool(self.model):
            raise ValueError('speculative method "draft_model" needs a "model" (the draft\'s .gguf file or Hugging Face '
                             'folder), and only it takes one')
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be at least 1")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min and prompt_lookup_max must satisfy 1 <= min <= max")


def parse_speculative_config(text: str | dict | None) -> SpeculativeConfig | None:
    """The --speculative-config JSON (or its dict) -> a SpeculativeConfig (None for no speculation); ValueError if
    it is wrong."""
    if not text:
        return None
    fields = parse_json_object(text, "--speculative-config", _FIELDS)
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


def may_draft(s: SamplingParams) -> bool:
    """Sampling whose per-position draws need nothing but the tokens before them, so drafts verify exactly: no
    penalties (their counts would include drafts), no logprobs (one per token, per row), no masks (a grammar's or a
    thinking budget's are not applied at draft positions). The scheduler drafts, and the worker's draft model
    proposes, for these only."""
    return not s.pools and s.logprobs is None and not s.uses_penalties and not s.masked


def resolve_draft_model(config: SpeculativeConfig, target) -> SpeculativeConfig:
    """config with its draft model's path resolved (for the worker), checked against the target's ModelConfig:
    ValueError if the draft's vocabulary differs (a draft model must share the target's tokenizer)."""
    from tinyvllm.protocol.model_config import read_model_config
    from tinyvllm.protocol.model_path import resolve_model_path
    path = resolve_model_path(config.model)
    draft = read_model_config(path)
    check_draft_vocab(draft.vocab_size, target.vocab_size, config.model)
    return dataclasses.replace(config, model=str(path))


def check_draft_vocab(draft_vocab_size: int, target_vocab_size: int, name: str) -> None:
    if draft_vocab_size != target_vocab_size:
        raise ValueError(f"the draft model {name} has a vocabulary of {draft_vocab_size} tokens, the target "
                         f"{target_vocab_size}: a draft model must share the target's tokenizer")
