"""ServedEngine feeds vllm:request_queue_time_seconds once per request from the scheduler's queue_time_s."""
import pytest

from tinyvllm.frontend.api.request_gate import RequestGate
from tinyvllm.frontend.api.served_engine import ServedEngine
from tinyvllm.protocol.messages import RequestOutput
from tinyvllm.protocol.sampling import SamplingParams


class _Recorder:
    def __init__(self):
        self.queue_times = []

    def record_queue_time(self, seconds):
        self.queue_times.append(seconds)

    def record_request_params(self, n, max_tokens):
        pass

    def record_inter_token_latency(self, seconds):
        pass

    def record_streamed_tokens(self, count):
        pass


class _Engine:
    async def generate(self, req_id, prompt_token_ids, sampling, eos_token_ids):
        for out in (RequestOutput(req_id, [1], index=0, queue_time_s=0.25), RequestOutput(req_id, [2], index=1, queue_time_s=0.25),
                    RequestOutput(req_id, [3], "length", index=0, queue_time_s=0.25),
                    RequestOutput(req_id, [4], "length", index=1, queue_time_s=0.25)):
            yield out


@pytest.mark.anyio
async def test_queue_time_recorded_once_per_request():
    recorder = _Recorder()
    engine = ServedEngine(_Engine(), RequestGate(), recorder)
    outs = [o async for o in engine.generate("r", [1, 2], SamplingParams(n=2), [2])]
    assert len(outs) == 4 and recorder.queue_times == [0.25]

