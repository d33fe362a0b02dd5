"""The offline LLM as a synchronous wrapper over an engine pool of one replica: its bookkeeping for n > 1 and
streaming against a scripted client, and a dying engine process against the real EngineClient on ZMQ sockets."""
import gc
import pathlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import zmq

from fake_tokenizer import CharTokenizer
from tinyvllm.frontend.engine import llm as llm_module
from tinyvllm.frontend.engine.engine_client import EngineClient, EngineDeadError
from tinyvllm.frontend.engine.engine_pool import EnginePool
from tinyvllm.frontend.engine.engine_replica import EngineReplica, RestartPolicy
from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.messages import AddRequest, EngineReady, FinishReason, RequestOutput, SchedulerStats
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.protocol.transport import Endpoints, make_socket, recv, send

READY = EngineReady(num_blocks=16, block_size=16, max_model_len=256, max_num_seqs=8, num_workers=1)


class FakeProcesses:
    """EngineProcesses' start/dead_process/stop, with no processes; setting `exited` makes one "die"."""

    def __init__(self, exited: bool = False):
        self.exited = threading.Event()
        if exited:
            self.exited.set()
        self.stopped = False

    def start(self) -> None:
        pass

    def dead_process(self) -> str | None:
        return "tinyvllm-worker0 exited with code 1" if self.exited.is_set() else None

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopped = True


class ScriptedEngine:
    """EngineClient's surface; the k-th request gets the outputs `script(k)`: (index, text, finish_reason)."""

    def __init__(self, script):
        self.script, self.stats, self.dead_reason = script, SchedulerStats(), None
        self.requests: list[str] = []
        self.left_early: list[str] = []
        self.closed = False

    async def start(self, timeout_s, dead_process=None) -> EngineReady:
        return READY

    async def generate(self, req_id, prompt_token_ids, sampling, eos_token_ids):
        k, finished = len(self.requests), False
        self.requests.append(req_id)
        try:
            for index, text, finish in self.script(k):
                error = "boom" if finish == FinishReason.ERROR else None
                yield RequestOutput(req_id, CharTokenizer().encode(text, add_special_tokens=False), finish,
                                    len(prompt_token_ids), 0, error, index)
            finished = True
        finally:
            if not finished:
                self.left_early.append(req_id)

    async def close(self) -> None:
        self.closed = True


class OfflineLLM(LLM):
    """An LLM over the given engine client and processes (one replica that is never restarted), with a
    one-token-per-character tokenizer."""

    def __init__(self, engine, procs=None, startup_timeout_s: float = 5.0):
        procs = procs or FakeProcesses()
        replica = EngineReplica(0, lambda: (procs, engine), restart=RestartPolicy(max_attempts=0))
        self._start(EnginePool([replica]), CharTokenizer(), startup_timeout_s)


def test_generate_returns_every_sample_through_the_engine_client():
    def script(k):
        return [(0, "ab", None), (1, "xy", None), (1, "z", FinishReason.LENGTH), (0, "c", FinishReason.STOP)]
    engine = ScriptedEngine(script)
    with OfflineLLM(engine) as llm:
        (result,) = llm.generate("Hi", SamplingParams(n=2, max_tokens=3))
    assert len(engine.requests) == 1 and engine.closed
    assert [(o.index, o.text, o.finish_reason) for o in result.outputs] == [(0, "abc", "stop"), (1, "xyz", "length")]
    assert (result.text, result.finish_reason, result.error) == ("abc", "stop", None)
    assert result.token_ids == result.outputs[0].token_ids


def test_generate_n1_keeps_its_shape_and_an_error_leaves_the_other_samples_unfinished():
    def script(k):
        return [(0, "ok", FinishReason.STOP)] if k == 0 else [(0, "a", None), (1, "", FinishReason.ERROR)]
    with OfflineLLM(ScriptedEngine(script)) as llm:
        first, second = llm.generate(["Hi", "Ho"], [SamplingParams(), SamplingParams(n=3)])
    assert (first.text, first.finish_reason, len(first.outputs)) == ("ok", "stop", 1)
    assert second.outputs[1].finish_reason == "error" and second.outputs[2].finish_reason is None
    assert second.error == "boom"


def test_stream_yields_text_and_closing_it_early_leaves_the_request():
    engine = ScriptedEngine(lambda k: [(0, "ab", None), (0, "cd", None), (0, "e", FinishReason.STOP)])
    with OfflineLLM(engine) as llm:
        assert "".join(llm.stream("Hi")) == "abcde"
        early = llm.stream("Ho")
        assert next(early) == "ab"
        early.close()
        assert engine.left_early == [engine.requests[1]]


def test_llm_speaks_to_the_engine_only_through_engine_client():
    source = pathlib.Path(llm_module.__file__).read_text()
    for protocol_name in ("zmq", "AddRequest", "AbortRequests", "StepOutputs", "transport", "codec"):
        assert protocol_name not in source


def test_garbage_collection_stops_the_processes_and_the_loop():
    procs, engine = FakeProcesses(), ScriptedEngine(lambda k: [])
    llm = OfflineLLM(engine, procs)
    loop_thread = llm._loop._thread
    del llm
    gc.collect()
    assert procs.stopped and engine.closed and not loop_thread.is_alive()


@pytest.fixture
def scheduler_sockets(tmp_path):
    """The scheduler's ends of the sockets (it has sent EngineReady), and an EngineClient on the other ends."""
    endpoints = Endpoints.ipc(str(tmp_path))
    ctx = zmq.Context()
    inbox = make_socket(ctx, zmq.PULL, endpoints.scheduler_input, bind=True)
    outbox = make_socket(ctx, zmq.PUSH, endpoints.frontend_output, bind=False)
    send(outbox, READY)
    yield inbox, EngineClient(endpoints.scheduler_input, endpoints.frontend_output)
    ctx.destroy(linger=0)


def test_an_engine_process_dying_fails_generate_instead_of_hanging(scheduler_sockets):
    inbox, engine = scheduler_sockets
    procs = FakeProcesses()
    llm, caller = OfflineLLM(engine, procs), ThreadPoolExecutor(1)
    try:
        result = caller.submit(llm.generate, "Hi")
        assert inbox.poll(5000) and isinstance(recv(inbox), AddRequest)
        procs.exited.set()
        with pytest.raises(EngineDeadError, match="worker0 exited"):
            result.result(timeout=10)
    finally:
        llm.shutdown()
        caller.shutdown(wait=False)
    assert procs.stopped and not llm._loop._thread.is_alive()


def test_an_engine_process_dying_before_ready_fails_the_start(scheduler_sockets):
    _, engine = scheduler_sockets
    procs = FakeProcesses(exited=True)
    with pytest.raises(EngineDeadError, match="failed to start: tinyvllm-worker0"):
        OfflineLLM(engine, procs, startup_timeout_s=5)
    assert procs.stopped
