"""The persistent prefix cache's files for the fake worker: chain hash -> a block's fake KV slots. One FakeDisk
outlives a scheduler and its worker, so a test can "restart" the engine over it."""
from dataclasses import dataclass, field

from tinyvllm.protocol.messages import StepPlan, StepResult


@dataclass
class FakeDisk:
    files: dict[bytes, list] = field(default_factory=dict)
    corrupt: set[bytes] = field(default_factory=set)  # a load of these fails, as a worker's check would
    num_loads: int = 0

    def index(self, block_bytes: int = 1) -> list[tuple[bytes, int]]:
        """What scan_disk_dir would find, oldest first."""
        return [(block_hash, block_bytes) for block_hash in self.files]

    def before_step(self, kv: list, block_size: int, plan: StepPlan) -> None:
        """Saves are read before the step writes anything; deletes follow them."""
        for save in plan.kv_disk_saves:
            slots = kv[save.block_id * block_size:(save.block_id + 1) * block_size]
            assert all(slots), f"saving block {save.block_id}, which is not full"
            self.files.pop(save.block_hash, None)  # a rewrite is the newest file
            self.files[save.block_hash] = slots
        for block_hash in plan.kv_disk_deletes:
            self.files.pop(block_hash, None)

    def after_step(self, kv: list, block_size: int, plan: StepPlan, result: StepResult, held: set[int]) -> None:
        for load in plan.kv_disk_loads:
            assert load.block_id not in held, f"loading block {load.block_id} from disk, held by a request"
            self.num_loads += 1
            if load.block_hash not in self.files or load.block_hash in self.corrupt:
                result.kv_disk_failed_block_ids.append(load.block_id)
            else:
                kv[load.block_id * block_size:(load.block_id + 1) * block_size] = self.files[load.block_hash]
