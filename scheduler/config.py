"""The scheduler's limits, fixed at start-up: the engine's knobs (protocol/engine_config.py) as resolved for this
engine, with what only the start-up tells (the pool's blocks and swap slots, the context served, whether async
scheduling applies). scheduler/main.py's scheduler_config() builds it; the tests build it directly."""
from dataclasses import dataclass

from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.speculative_config import SpeculativeConfig

_DEFAULTS = EngineConfig()  # the knobs' declared defaults, not written again here


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_blocks: int
    enable_prefix_caching: bool = _DEFAULTS.cache.enable_prefix_caching
    # Planned steps whose results may be outstanding at once: 2 lets the scheduler plan step N+1 while step N
    # runs; P pipeline stages need P to stay busy.
    max_steps_in_flight: int = 1
    # Plan a request again while its step is in flight (scheduler/async_scheduling.py): only for one worker.
    async_scheduling: bool = False
    # disaggregated prefill: how long finished prompts' blocks wait for a decode to pull them
    kv_lease_s: float = _DEFAULTS.kv_transfer.kv_lease_s
    world_size: int = 1  # workers that each release a lease (scheduler/remote_kv.py)
    sliding_window: int = 0  # every layer of the model attends to this many last positions only (0: all of them)
    num_swap_slots: int = 0  # --swap-space: host slots of one KV block each (scheduler/swap.py); 0: always recompute
    swap_min_tokens: int = 32  # a preempted request with fewer computed tokens is recomputed (scheduler/swap.py)
    speculative: SpeculativeConfig | None = None  # --speculative-config (scheduler/spec_decode.py); None: off
    max_loras: int = 0  # --enable-lora's --max-loras: adapters running at once (so in one step); 0: no adapters

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "num_blocks",
                     "max_steps_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.speculative is not None and self.async_scheduling:  # drafts are planned for requests in no step
            raise ValueError("speculative decoding needs async scheduling off")

    @property
    def blocks_per_request(self) -> int | None:
        """With a sliding window, the most blocks a request ever holds at once (its window and a chunk of new
        tokens, a draft model's lookahead, one block more for the alignment); None: its whole length."""
        if not self.sliding_window:
            return None
        spec = self.speculative  # a draft model's lookahead slots (scheduler/spec_decode.py)
        lookahead = spec.num_speculative_tokens if spec is not None and spec.method == "draft_model" else 0
        return -(-(self.sliding_window - 1 + self.max_num_batched_tokens + lookahead) // self.block_size) + 1
