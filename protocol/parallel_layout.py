"""How one model is spread over tensor- and pipeline-parallel workers: which rank holds what (no tinygrad here,
so the launcher can refuse a size that does not split before it starts anything).

Ranks are numbered stage by stage: rank = pp_rank * tp_size + tp_rank. Tensor parallelism splits every layer
Megatron-style (query heads, KV heads, the MLP's hidden units and the vocabulary, each rank a contiguous range);
when there are fewer KV heads than ranks each KV head is replicated on tp_size / n_kv_heads ranks, as vLLM does.
Pipeline parallelism gives each stage a contiguous range of layers, the remainder to the last stage (vLLM's
get_pp_indices). The rank that samples is the first rank of the last stage.
"""
from dataclasses import dataclass

from tinyvllm.protocol.model_config import ModelConfig


def tensor_parallel_problem(cfg: ModelConfig, tp_size: int) -> str | None:
    """Why the model cannot be split over tp_size ranks, or None when it can."""
    if tp_size < 1:
        return "must be at least 1"
    if cfg.n_heads % tp_size:
        return f"the model's {cfg.n_heads} attention heads do not divide by it"
    if cfg.n_kv_heads % tp_size and tp_size % cfg.n_kv_heads:
        return f"neither divides the other with the model's {cfg.n_kv_heads} KV heads"
    if cfg.n_experts and cfg.expert_ffn_dim % tp_size:
        return f"the model's experts' {cfg.expert_ffn_dim} units do not divide by it"
    if not cfg.n_experts and cfg.ffn_dim % tp_size:
        return f"the model's {cfg.ffn_dim} MLP units do not divide by it"
    return None


def working_tensor_parallel_sizes(cfg: ModelConfig) -> list[int]:
    return [t for t in range(1, cfg.n_heads + 1) if tensor_parallel_problem(cfg, t) is None]


def check_parallel_sizes(cfg: ModelConfig, tp_size: int, pp_size: int) -> None:
    """Raises ValueError, naming the sizes that work, when the model cannot be split this way."""
    if (problem := tensor_parallel_problem(cfg, tp_size)) is not None:
        sizes = ", ".join(map(str, working_tensor_parallel_sizes(cfg)))
        raise ValueError(f"--tensor-parallel-size {tp_size} does not split this model: {problem} "
                         f"(sizes that work: {sizes})")
    if not 1 <= pp_size <= cfg.n_layers:
        raise ValueError(f"--pipeline-parallel-size must be between 1 and the model's {cfg.n_layers} layers")


def kv_head_range(n_kv_heads: int, tp_rank: int, tp_size: int) -> range:
    """The KV heads (global indices) tensor-parallel rank tp_rank holds: an equal share, or, with fewer KV heads
    than ranks, the one head it replicates."""
    if n_kv_heads < tp_size:
        first = tp_rank * n_kv_heads // tp_size
        return range(first, first + 1)
    per_rank = n_kv_heads // tp_size
    return range(tp_rank * per_rank, (tp_rank + 1) * per_rank)


def stage_layers(n_layers: int, pp_rank: int, pp_size: int) -> range:
    """The contiguous layers of stage pp_rank; the last stage also takes the remainder."""
    per_stage = n_layers // pp_size
    start = pp_rank * per_stage
    return range(start, n_layers if pp_rank == pp_size - 1 else start + per_stage)


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One worker's place in its engine."""
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    @classmethod
    def of_rank(cls, rank: int, tp_size: int, pp_size: int) -> "ShardSpec":
        return cls(rank % tp_size, tp_size, rank // tp_size, pp_size)

    @property
    def rank(self) -> int:
        return self.pp_rank * self.tp_size + self.tp_rank

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def samples(self) -> bool:
        """The one rank whose StepResult the scheduler reads."""
        return self.last_stage and self.tp_rank == 0

    def layers(self, n_layers: int) -> range:
        return stage_layers(n_layers, self.pp_rank, self.pp_size)


def output_rank(tp_size: int, pp_size: int) -> int:
    return ShardSpec(0, tp_size, pp_size - 1, pp_size).rank
