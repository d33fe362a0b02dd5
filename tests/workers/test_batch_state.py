"""BatchState under async scheduling: a plan that says append_sampled makes the worker append the token it sampled
for the request itself (once, counted by the penalties' statistics too); with nothing sampled it is an error."""
import pytest

from tinyvllm.protocol.messages import CachedRequestData, NewRequestData, StepPlan
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.workers.batch_state import BatchState

PENALISED = SamplingParams(frequency_penalty=0.5)


def started(prompt=(5, 6, 7)) -> BatchState:
    batch = BatchState()
    (chunk,) = batch.apply(StepPlan(1, [NewRequestData("a", list(prompt), PENALISED, [0], 0, len(prompt))], [], []))
    assert chunk.samples
    return batch


def test_the_worker_appends_its_own_sampled_token_once():
    batch = started()
    state = batch.requests["a"]
    state.token_stats(vocab_size=16)
    state.last_sampled = 9  # what ModelRunner.execute records for a row it samples
    (chunk,) = batch.apply(StepPlan(2, [], [CachedRequestData("a", [], 3, 1, [], True)], []))
    assert state.token_ids == [5, 6, 7, 9] and state.num_output_tokens == 1 and state.stats.output_counts[9] == 1
    assert (chunk.start, chunk.length, chunk.samples) == (3, 1, True)
    assert state.last_sampled is None  # consumed: a later plan cannot append it again
    state.last_sampled = 11
    batch.apply(StepPlan(3, [], [CachedRequestData("a", [], 4, 1, [], True)], []))
    assert state.token_ids == [5, 6, 7, 9, 11] and state.stats.output_counts[11] == 1


def test_tokens_the_plan_brings_go_first_and_clear_the_sampled_one():
    batch = started()
    state = batch.requests["a"]
    state.last_sampled = 9
    batch.apply(StepPlan(2, [], [CachedRequestData("a", [], 3, 1, [9])], []))  # the scheduler brought it back
    assert state.token_ids == [5, 6, 7, 9] and state.last_sampled is None
    with pytest.raises(ValueError, match="none was sampled"):
        batch.apply(StepPlan(3, [], [CachedRequestData("a", [], 4, 1, [], True)], []))
