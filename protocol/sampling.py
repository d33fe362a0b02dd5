"""Sampling parameters: what the frontend asks for, what the worker samples with."""
from dataclasses import dataclass, field

MAX_N = 128  # parallel samples per request
MAX_LOGPROBS = 20  # most top logprobs per position (vLLM's --max-logprobs default)
MAX_LOGIT_BIAS = 100.0  # logit_bias values are clamped to [-100, 100], as OpenAI and vLLM do
# Logprobs entries (a position's chosen token and each of its top ones) one request may ask for, all samples
# together: at most about 17 MB on the wire, so one request's output fits in a message (protocol/codec.py, 64 MiB).
MAX_LOGPROB_ENTRIES = 1_000_000
MAX_BEAM_WIDTH = MAX_LOGPROBS // 2  # each beam search step asks for 2 x beam_width logprobs
MAX_GRAMMAR_CHARS = 65536  # a structured output's schema, regex or grammar, and the grammar it becomes
MAX_SCORE_TOKENS = 16  # token ids a scoring request may ask the logits of
GREEDY_TEMPERATURE = 1e-5  # at or below it a row samples the argmax: SamplingParams.greedy and workers/sampler.py


@dataclass(slots=True)
class KVTransferParams:
    """vLLM's request-level contract for disaggregated prefill/decode (the body's `kv_transfer_params`).
    To a prefill instance: do_remote_decode (compute the prompt, keep its blocks under a lease). Back from it, and
    on to a decode instance: do_remote_prefill plus where the blocks are (the prefill worker's side channel)."""
    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_block_ids: list[int] = field(default_factory=list)
    remote_engine_id: str = ""
    remote_host: str = ""
    remote_port: int = 0
    remote_request_id: str = ""
    tp_size: int = 1
    remote_num_tokens: int = 0  # how many prompt tokens the remote blocks hold (all but the last)


@dataclass(slots=True)
class ThinkingParams:
    """A reasoning model's thinking as the sampling worker follows it (workers/thinking_phase.py): the tokens that
    open and close it (single tokens, as Qwen3's and DeepSeek-R1's are: a tag of several tokens could be spelled
    otherwise in a reply, and the frontend follows no such model), whether the prompt left the thinking open, and
    the most tokens it may take before the worker makes the reply close it (None: no limit). The grammar of a
    structured reply or a tool call applies after the thinking."""
    start_id: int
    end_id: int
    opened: bool = False
    budget: int | None = None

    def validate(self) -> None:
        if self.budget is not None and self.budget < 0:
            raise ValueError(f"thinking_token_budget must be non-negative, got {self.budget}")


@dataclass(slots=True)
class BeamSearchParams:
    """vLLM's BeamSearchParams; the frontend runs the search (frontend/engine/beam_search.py), the engine never sees
    it."""
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    length_penalty: float = 1.0  # finished beams rank by cumulative logprob / length ** length_penalty

    def validate(self) -> None:
        if not 1 <= self.beam_width <= MAX_BEAM_WIDTH:
            raise ValueError(f"beam_width must be between 1 and {MAX_BEAM_WIDTH}, got {self.beam_width}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")


MAX_LORA_NAME_CHARS, MAX_LORA_PATH_CHARS = 256, 4096


@dataclass(slots=True)
class LoRARequest:
    """A LoRA adapter over the served model, vLLM's LoRARequest(lora_name, lora_int_id, lora_path): a PEFT folder on
    the workers' machine. Its name, id and path together are the adapter (`key`): they key the workers' loaded
    adapters and salt the prefix cache (scheduler/request.py), so a reload (a new id) or another folder under a reused
    name is another adapter."""
    lora_name: str
    lora_int_id: int = 0
    lora_path: str = ""

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    @property
    def key(self) -> str:
        """What makes it one adapter: a new id (a reload, a re-created model) or path is another."""
        return f"{self.lora_name}\n{self.lora_int_id}\n{self.lora_path}"

    def validate(self) -> None:
        if not 0 < len(self.name) <= MAX_LORA_NAME_CHARS or not 0 < len(self.path) <= MAX_LORA_PATH_CHARS:
            raise ValueError(f"a LoRA adapter needs a name of 1 to {MAX_LORA_NAME_CHARS} characters and a path of "
                             f"1 to {MAX_LORA_PATH_CHARS}")


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1  # parallel samples of one prompt; the scheduler forks children that share the prompt's KV blocks
    min_p: float = 0.0  # drop tokens whose probability is below min_p times the most likely one's
    presence_penalty: float = 0.0  # subtracted from the logit of every token already in the output
    frequency_penalty: float = 0.0  # subtracted once per occurrence in the output
    repetition_penalty: float = 1.0  # divides positive (multiplies negative) logits of prompt and output tokens
    # logit_bias as two parallel lists (msgpack map keys must be strings): added to those tokens' logits
    logit_bias_token_ids: list[int] = field(default_factory=list)
    logit_bias_values: list[float] = field(default_factory=list)
    min_tokens: int = 0  # EOS and stop_token_ids cannot be sampled before this many output tokens
    logprobs: int | None = None  # per sampled token: its logprob and the top-k (k = this) logprobs
    prompt_logprobs: int | None = None  # the same for every prompt token after the first
    embed: bool = False  # a pooling request: the worker returns the prompt's embedding and samples nothing
    # a scoring request (rerank): the worker returns these tokens' logits at the prompt's last position (as its
    # `embedding`) and samples nothing
    score_token_ids: list[int] = field(default_factory=list)
    # structured output: an llguidance grammar (frontend/api/structured_output.py) that masks every sampled token
    grammar: str | None = None
    thinking: ThinkingParams | None = None  # a reasoning model's chat reply
    # Disaggregated prefill/decode (scheduler/remote_kv.py); vLLM carries it in SamplingParams.extra_args too.
    kv_transfer: KVTransferParams | None = None
    lora: LoRARequest | None = None  # the adapter the request runs with (--enable-lora); None: the base model

    @property
    def greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE

    @property
    def pools(self) -> bool:
        """The request ends with its prompt and returns a vector (an embedding, or the scored tokens' logits) instead
        of sampling tokens."""
        return self.embed or bool(self.score_token_ids)

    @property
    def logit_bias(self) -> dict[int, float]:
        return dict(zip(self.logit_bias_token_ids, self.logit_bias_values))

    def set_logit_bias(self, bias: dict[int, float]) -> None:
        """Stores bias with every value clamped to [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS]."""
        self.logit_bias_token_ids = [int(t) for t in bias]
        self.logit_bias_values = [min(MAX_LOGIT_BIAS, max(-MAX_LOGIT_BIAS, float(v))) for v in bias.values()]

    def num_logprob_entries(self, num_prompt_tokens: int) -> int:
        """Logprobs entries the request may return, at most: every sample has its own prompt logprobs too."""
        prompt = num_prompt_tokens * (self.prompt_logprobs + 1) if self.prompt_logprobs is not None else 0
        sampled = self.max_tokens * (self.logprobs + 1) if self.logprobs is not None else 0
        return self.n * (prompt + sampled)

    @property
    def masked(self) -> bool:
        """The worker masks this request's tokens: a grammar, or a thinking budget it may have to enforce."""
        return self.grammar is not None or (self.thinking is not None and self.thinking.budget is not None)

    @property
    def uses_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def validate(self) -> None:
        """Raises ValueError with a message fit for an HTTP 400 (vLLM's wording where it has one)."""
        if self.temperature < 0:
            raise ValueError("temperature must be non-negative, got %s" % self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1], got %s" % self.top_p)
        if self.top_k < -1:
            raise ValueError("top_k must be -1 (disable), 0 (disable) or at least 1, got %s" % self.top_k)
        if self.top_k > 2**31 - 1:  # the wire and the worker hold it as a 32-bit integer
            raise ValueError("top_k must be at most 2147483647, got %s" % self.top_k)
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1, got %s" % self.max_tokens)
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ValueError("seed must fit in a signed 64-bit integer")
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be between 1 and {MAX_N}, got {self.n}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}.")
        if self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if not self.pools and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                             f"got {self.min_tokens}.")
        if self.score_token_ids and (self.embed or len(self.score_token_ids) > MAX_SCORE_TOKENS or self.n != 1
                                     or not 0 <= min(self.score_token_ids) <= max(self.score_token_ids) < 2**31):
            raise ValueError(f"a scoring request scores 1 to {MAX_SCORE_TOKENS} token ids (int32, non-negative), with "
                             f"n = 1 and no embedding")
        if self.grammar is not None and len(self.grammar) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"the structured output grammar is longer than {MAX_GRAMMAR_CHARS} characters")
        if self.thinking is not None:
            self.thinking.validate()
        if self.lora is not None:
            self.lora.validate()
        if len(self.logit_bias_token_ids) != len(self.logit_bias_values):
            raise ValueError("logit_bias: token ids and values differ in length")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be non-negative, got {value}.")
            if value is not None and value > MAX_LOGPROBS:
                kind = "sample" if name == "logprobs" else "prompt"
                raise ValueError(f"Requested {kind} logprobs of {value}, which is greater than max allowed: "
                                 f"{MAX_LOGPROBS}")
