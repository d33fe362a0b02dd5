"""The message bound on the scheduler's side: a worker's StepResult that came in parts is merged before it is
applied, a step's outputs over the bound go to the frontend in several StepOutputs, and an output too large for any
message becomes an ERROR for its request, whose blocks return to the pool. The bound is lowered in the tests."""
import threading

import pytest
import zmq

from fake_worker import FakeWorker, make_request, make_scheduler, run_to_completion, tokens_of
from in_flight_driver import InFlightDriver
from invariants import check_scheduler_invariants
from tinyvllm.protocol import codec
from tinyvllm.protocol.codec import decode, encode
from tinyvllm.protocol.engine_config import EngineConfig
from tinyvllm.protocol.messages import FinishReason, Shutdown, StepOutputs, StepPlan, StepResult, TokenLogprobs
from tinyvllm.protocol.process_args import SchedulerArgs
from tinyvllm.protocol.transport import Endpoints, make_socket, send
from tinyvllm.scheduler.main import SchedulerLoop
from tinyvllm.scheduler.output_messages import split_step_outputs
from tinyvllm.scheduler.request import RequestStatus
from tinyvllm.workers.scheduler_connection import send_step_result

BOUND = 1500


def fake_prompt_logprobs(req_id: str, num_prompt_tokens: int) -> list[TokenLogprobs]:
    seed = sum(map(ord, req_id))
    return [TokenLogprobs(seed + i, -0.5 - i, [seed, i], [-0.25, -1.5 - i]) for i in range(num_prompt_tokens - 1)]


class PartsWorkers:
    """WorkerGroup after its handshake, one rank: a plan runs on the fake worker, which adds (made-up) prompt logprobs
    to a request's first sampled row when it asked, and the result goes out as a real worker sends it."""
    output_rank = 0

    def __init__(self, ctx: zmq.Context, worker: FakeWorker):
        self.worker, self.reported = worker, set()
        self.sock = make_socket(ctx, zmq.PULL, "inproc://parts-workers", bind=True)
        self._results = make_socket(ctx, zmq.PUSH, "inproc://parts-workers", bind=False)
        self.num_results = self.num_parts = 0

    def broadcast(self, msg, skip_gone: bool = False) -> None:
        if isinstance(msg, StepPlan):
            result = self.worker.execute(msg)
            rows = []
            for req_id in result.req_ids:
                req = self.worker.reqs[req_id]
                asked = req.sampling.prompt_logprobs is not None and req_id not in self.reported
                rows.append(fake_prompt_logprobs(req_id, len(req.token_ids)) if asked else None)
                self.reported.add(req_id)
            if any(rows):
                result.prompt_logprobs = rows
            self.num_results += 1
            send_step_result(self._results, result)

    def recv(self, deadline: float):
        data = self.sock.recv()
        assert len(data) <= BOUND
        self.num_parts += 1
        return b"", decode(data)


def requests():
    # One step prefills all four (a budget of 64 tokens); three rows carry ~700 bytes of prompt logprobs each.
    return [make_request(name, 20, max_tokens=3, prompt_logprobs=2) for name in "abc"] + [make_request("d", 4)]


def test_the_loop_merges_result_parts_and_splits_step_outputs(tmp_path, monkeypatch):
    monkeypatch.setattr(codec, "MAX_SEND_BYTES", BOUND)
    sched, worker = make_scheduler()
    endpoints = Endpoints.ipc(str(tmp_path))
    frontend_ctx = zmq.Context()
    from_scheduler = make_socket(frontend_ctx, zmq.PULL, endpoints.frontend_output, bind=True)
    engine = EngineConfig.of(block_size=4, max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=64,
                             max_model_len=128)
    loop = SchedulerLoop(endpoints, SchedulerArgs(engine))
    to_scheduler = make_socket(frontend_ctx, zmq.PUSH, endpoints.scheduler_input, bind=False)
    loop.workers, loop.scheduler = PartsWorkers(loop.ctx, worker), sched
    for req in requests():
        sched.add_request(req)
    thread = threading.Thread(target=loop.loop, daemon=True)
    thread.start()
    outputs: dict[str, list] = {}
    step_ids = []
    try:
        while len([o for outs in outputs.values() for o in outs if o.finish_reason]) < 4:
            assert from_scheduler.poll(10_000), "no StepOutputs"
            data = from_scheduler.recv()
            assert len(data) <= BOUND
            msg = decode(data)
            assert isinstance(msg, StepOutputs)
            step_ids.append(msg.stats.step_id)
            for out in msg.outputs:
                outputs.setdefault(out.req_id, []).append(out)
        send(to_scheduler, Shutdown("done"))
        thread.join(10)
        assert not thread.is_alive()
    finally:
        loop.ctx.destroy(linger=0)
        frontend_ctx.destroy(linger=0)
    assert loop.workers.num_parts > loop.workers.num_results  # some result came in parts
    assert len(step_ids) > len(set(step_ids))  # and some step's outputs in several messages
    for name in "abc":
        assert outputs[name][0].prompt_logprobs == fake_prompt_logprobs(name, 20)
        assert all(out.prompt_logprobs is None for out in outputs[name][1:])
    reference_sched, reference_worker = make_scheduler()
    for req in requests():
        reference_sched.add_request(req)
    expected = run_to_completion(reference_sched, reference_worker)
    assert {k: tokens_of(v) for k, v in outputs.items()} == {k: tokens_of(v) for k, v in expected.items()}


def first_step_outputs(sched, worker, huge: str, huge_index: int):
    """The outputs of the first step, the one of (huge, huge_index) with prompt logprobs too large for a message."""
    plan = sched.schedule()
    outputs = sched.update_from_output(plan, worker.execute(plan))
    for out in outputs:
        if (out.req_id, out.index) == (huge, huge_index):
            out.prompt_logprobs = fake_prompt_logprobs(huge, 200)
    assert len(encode(StepOutputs(outputs, sched.stats()))) > BOUND
    return outputs


@pytest.mark.parametrize("n", [1, 2])
def test_an_output_too_large_alone_becomes_an_error_and_frees_its_blocks(monkeypatch, n):
    monkeypatch.setattr(codec, "MAX_SEND_BYTES", BOUND)
    sched, worker = make_scheduler(num_blocks=32)
    sched.add_request(make_request("big", 20, max_tokens=8, n=n, prompt_logprobs=2))
    sched.add_request(make_request("small", 8, max_tokens=8))
    big = sched.requests["big" if n == 1 else "big#1"]
    outputs = first_step_outputs(sched, worker, "big", n - 1)
    free_before, big_blocks = sched.kv_cache_manager.num_free_blocks, len(big.block_ids)

    messages = split_step_outputs(sched, outputs)
    sent = [out for msg in messages for out in msg.outputs]
    assert all(len(encode(msg)) <= BOUND for msg in messages)
    assert [(o.req_id, o.index) for o in sent] == [(o.req_id, o.index) for o in outputs]
    failed = next(o for o in sent if (o.req_id, o.index) == ("big", n - 1))
    assert failed.finish_reason == FinishReason.ERROR and failed.new_token_ids == []
    assert "exceed the 1500-byte message bound" in failed.error and "prompt_logprobs" in failed.error
    assert failed.error_kind == "invalid_request"  # the client asked for more than fits: a 400
    assert [o for o in sent if o is not failed] == [o for o in outputs if o.req_id != "big" or o.index != n - 1]
    assert big.status is RequestStatus.FINISHED and big.finish_reason == FinishReason.ERROR and big.block_ids == []
    assert sched.kv_cache_manager.num_free_blocks == free_before + big_blocks
    assert all(msg.stats.num_free_blocks == free_before + big_blocks for msg in messages)
    check_scheduler_invariants(sched)

    plan = sched.schedule()
    assert big.req_id in plan.finished_req_ids
    outputs = {}
    for out in sched.update_from_output(plan, worker.execute(plan)):
        outputs.setdefault(out.req_id, []).append(out)
    for req_id, outs in run_to_completion(sched, worker).items():
        outputs.setdefault(req_id, []).extend(outs)
    assert tokens_of(outputs["small"]) and outputs["small"][-1].finish_reason == FinishReason.LENGTH
    if n == 2:  # the other child goes on
        assert [o.finish_reason for o in outputs["big"] if o.finish_reason] == [FinishReason.LENGTH]
    assert sched.kv_cache_manager.num_free_blocks == 32


def test_an_output_that_already_finished_its_request_is_replaced_too(monkeypatch):
    monkeypatch.setattr(codec, "MAX_SEND_BYTES", BOUND)
    sched, worker = make_scheduler(num_blocks=32)
    sched.add_request(make_request("big", 20, max_tokens=1, prompt_logprobs=2))
    outputs = first_step_outputs(sched, worker, "big", 0)
    assert outputs[0].finish_reason == FinishReason.LENGTH and not sched.has_unfinished()
    (msg,) = split_step_outputs(sched, outputs)
    assert [(o.req_id, o.finish_reason) for o in msg.outputs] == [("big", FinishReason.ERROR)]
    assert sched.kv_cache_manager.num_free_blocks == 32


def test_a_request_ended_while_its_next_step_is_in_flight(monkeypatch):
    """Async scheduling: the request's next step is planned before its outputs are sent; that step's token for it
    is dropped, as after an abort."""
    monkeypatch.setattr(codec, "MAX_SEND_BYTES", BOUND)
    sched, worker = make_scheduler(num_blocks=32, max_steps_in_flight=2, async_scheduling=True)
    sched.add_request(make_request("big", 20, max_tokens=8, prompt_logprobs=2))
    sched.add_request(make_request("small", 8, max_tokens=8))
    driver = InFlightDriver(sched, worker)
    driver.fill()
    outputs = driver.finish_oldest()
    driver.fill()
    assert len(driver.outstanding) == 2
    outputs[0].prompt_logprobs = fake_prompt_logprobs("big", 200)
    split_step_outputs(sched, outputs)
    assert [o.req_id for o in driver.finish_oldest()] == ["small"]
    rest = driver.run_to_completion()
    assert "big" not in rest and rest["small"][-1].finish_reason == FinishReason.LENGTH
    assert sched.kv_cache_manager.num_free_blocks == 32
