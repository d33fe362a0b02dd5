"""What the launcher starts each engine process with: the engine's configuration (its public part: secrets travel
in the environment, never on a command line) and what only that process needs to know. protocol/child_process.py
sends them as JSON and rebuilds them in the child."""
from dataclasses import dataclass

from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.parallel_layout import ShardSpec


@dataclass(slots=True)
class SchedulerArgs:
    engine: EngineConfig  # resolved: the model's path (a draft model's too) and the context served (max_model_len)
    # What the launcher read from the model: what every worker must match to join (protocol/compatibility.py).
    n_layers: int = 0
    model_fingerprint: str = ""
    sliding_window: int = 0  # the model's, where every layer has one: blocks behind it are freed
    data_parallel_rank: int = 0  # which of --data-parallel-size engines this is (its KV events' ports and label)
    startup_timeout_s: float = 900.0


@dataclass(slots=True)
class WorkerArgs:
    engine: EngineConfig  # a launcher's, or for `tinyvllm worker` the knobs its flags give (the model, sizes, kernels)
    rank: int = 0
    stage_address: str = ""  # where this worker receives the previous pipeline stage's output (not on the first)
    kv_address: str = ""  # a prefill worker: where its KV side channel binds (workers/kv_side_channel.py)

    @property
    def model(self) -> str | None:
        return self.engine.model.model

    @property
    def world_size(self) -> int:
        return self.engine.world_size

    @property
    def tp_size(self) -> int:
        return self.engine.parallel.tensor_parallel_size

    @property
    def pp_size(self) -> int:
        return self.engine.parallel.pipeline_parallel_size

    @property
    def role(self) -> str:
        return self.engine.kv_transfer.role

    @property
    def spec(self) -> ShardSpec:
        return ShardSpec.of_rank(self.rank, self.tp_size, self.pp_size)
