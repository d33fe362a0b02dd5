"""BackgroundWarmup's order and bookkeeping, with a stand-in runner: smallest bucket first, each once, a bucket a
served step already captured costs nothing, and the structured-output tokenizer is built last."""
from tinyvllm.workers.background_warmup import BackgroundWarmup


class Runner:
    token_buckets = [1, 2, 4, 8]
    captured_steps = None  # none stored on the disk

    def __init__(self, already: set[int]):
        self.already, self.calls = already, []

    def finish_warm_up(self) -> None:
        self.calls.append("finished")

    def warm_up_bucket(self, size: int) -> bool:
        self.calls.append(size)
        return size not in self.already


def test_captures_smallest_first_and_counts_only_new_captures():
    runner = Runner(already={2})
    warmup = BackgroundWarmup(runner, rank=0)
    while not warmup.done:
        warmup.capture_next()
    assert runner.calls == [1, 2, 4, 8, "finished"] and warmup.captured == 3
