"""workers/captured_steps.py: captured steps written to the disk and loaded by another runner of the same setup
compute the same tokens without capturing; a loaded step that fails is captured again; a step reading a buffer that
is not the model's, the cache's or its own is not written; an unreadable file is dropped, and a folder others may
write is not read."""
import numpy as np
from tinygrad import Tensor, TinyJit

from tests.workers.dense_reference import random_llama
from tests.workers.test_paged_attention import CFG
from tinyvllm.protocol.messages import CachedRequestData, NewRequestData, StepPlan
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.workers.captured_steps import ROOT_ENV, CapturedSteps, LoadedJit
from tinyvllm.workers.kv_cache import PagedKVCache
from tinyvllm.workers.model import Transformer
from tinyvllm.workers.model_runner import ModelRunner

WEIGHTS = random_llama(CFG, seed=21)


def runner_with_steps(kernel_set) -> ModelRunner:
    model, cache = Transformer(CFG, WEIGHTS, CFG.max_context, kernels=kernel_set), PagedKVCache(CFG, 16, 4)
    return ModelRunner(model, cache, max_num_seqs=2, max_model_len=32, max_num_batched_tokens=8,
                       captured_steps=CapturedSteps.for_model(model, cache, {"test": "captured steps"}))


def generate(runner: ModelRunner) -> list[int]:
    r = runner.execute(StepPlan(0, [NewRequestData("a", [3, 1, 4, 1, 5], SamplingParams(max_tokens=9, temperature=0.0),
                                                   [1, 2, 3], 0, 5)], [], []))
    tokens = [r.sampled_token_ids[0]]
    for s in range(4):
        r = runner.execute(StepPlan(1 + s, [], [CachedRequestData("a", [], 5 + s, 1, [tokens[-1]])], []))
        tokens.append(r.sampled_token_ids[0])
    runner.execute(StepPlan(9, [], [], ["a"]))
    return tokens


def test_a_second_runner_loads_the_steps_and_computes_the_same(kernel_set, tmp_path, monkeypatch):
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    first = runner_with_steps(kernel_set)
    expected = generate(first)
    assert not any(tmp_path.rglob("*.pkl"))  # written while idle, not by the step that captured
    first.captured_steps.store_all()
    stored = sorted(p.name for p in tmp_path.rglob("*.pkl"))
    assert {"forward-1.pkl", "forward-8.pkl"} <= set(stored) and any(n.startswith("sample-1-g1") for n in stored)
    second = runner_with_steps(kernel_set)
    loaded = [second.forward_jits[b] for b in (1, 8)]
    assert all(isinstance(j, LoadedJit) for j in loaded)
    captured = [j.captured for j in loaded]
    assert generate(second) == expected
    assert [j.captured for j in loaded] == captured and all(j.primed for j in loaded)  # replayed, never traced again
    assert all((d.stat().st_mode & 0o077) == 0 for d in tmp_path.iterdir())


def test_a_stored_step_that_fails_is_captured_again(kernel_set, tmp_path, monkeypatch):
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    first = runner_with_steps(kernel_set)
    expected = generate(first)
    first.captured_steps.store_all()
    second = runner_with_steps(kernel_set)
    broken = second.forward_jits[1]
    broken.captured = object()  # as a step would that a different device cannot run
    assert generate(second) == expected
    assert broken.captured is not None and not broken.steps.path("forward-1").exists()
    second.captured_steps.store_all()
    assert broken.steps.path("forward-1").exists()  # the new capture replaces it


def test_a_step_reading_another_buffer_is_not_written_and_a_broken_file_is_dropped(tmp_path):
    steps = CapturedSteps(tmp_path, {"w": Tensor.ones(4).contiguous().realize()})
    outside = Tensor.full((4,), 2.0).contiguous().realize()
    jit = TinyJit(lambda x: (x * outside).realize())
    for _ in range(3):
        jit(Tensor.ones(4).contiguous().realize())
    assert not steps.save("reads-outside", jit.captured) and not steps.path("reads-outside").exists()
    steps.path("broken").write_bytes(b"not a pickle")
    tmp_path.chmod(0o777)  # others may write here: nothing is read (pickle would run their code)
    assert steps.load("broken", None) is None and steps.path("broken").exists()
    tmp_path.chmod(0o700)
    assert steps.load("broken", None) is None and not steps.path("broken").exists()
    np.testing.assert_array_equal(jit(Tensor.ones(4).contiguous().realize()).numpy(), [2.0] * 4)


def test_idle_work_writes_what_requests_captured_and_shutdown_writes_within_its_time(kernel_set, tmp_path, monkeypatch):
    """Without a warm-up (LLM(...), --no-jit-warmup) the worker's idle work is writing the steps served requests
    captured, then nothing (it blocks on its socket); at shutdown the rest is written for a bounded time."""
    from tinyvllm.workers.main import idle_work
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    runner = runner_with_steps(kernel_set)
    assert idle_work(None, runner) is None  # nothing captured yet: nothing to do
    generate(runner)
    steps = runner.captured_steps
    pending = len(steps.pending)
    assert pending >= 2 and idle_work(None, runner) == steps.store_next
    steps.store_all(within_s=0)  # no time left: nothing written
    assert len(steps.pending) == pending and not any(tmp_path.rglob("*.pkl"))
    while (work := idle_work(None, runner)) is not None:
        work()
    assert not steps.pending and len(list(tmp_path.rglob("*.pkl"))) == pending
