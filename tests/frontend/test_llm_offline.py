"""LLM.generate's bookkeeping for n > 1, with the engine processes replaced by scripted outputs."""
import itertools

from fake_tokenizer import CharTokenizer
from tinyvllm.frontend.llm import LLM
from tinyvllm.protocol.codec import decode
from tinyvllm.protocol.messages import AbortRequests, AddRequest, FinishReason, RequestOutput
from tinyvllm.protocol.sampling import SamplingParams


class RecordingSocket:
    def __init__(self):
        self.sent = []

    def send(self, data, copy=True):
        self.sent.append(decode(bytes(data)))


class ScriptedLLM(LLM):
    """No processes: each submitted request gets the outputs `script(index_of_request)` returns."""

    def __init__(self, script):
        self.tokenizer, self.to_scheduler, self._ids, self.script = CharTokenizer(), RecordingSocket(), \
            itertools.count(), script

    def _outputs(self):
        adds = [m for m in self.to_scheduler.sent if isinstance(m, AddRequest)]
        for k, add in enumerate(adds):
            for index, text, finish in self.script(k):
                ids = CharTokenizer().encode(text, add_special_tokens=False)
                error = "boom" if finish == FinishReason.ERROR else None
                yield RequestOutput(add.req_id, ids, finish, len(add.prompt_token_ids), 0, error, index)

    def shutdown(self):
        pass


def test_generate_returns_every_sample():
    def script(k):
        return [(0, "ab", None), (1, "xy", None), (1, "z", FinishReason.LENGTH), (0, "c", FinishReason.STOP)]
    llm = ScriptedLLM(script)
    (result,) = llm.generate("Hi", SamplingParams(n=2, max_tokens=3))
    assert [(o.index, o.text, o.finish_reason) for o in result.outputs] == [(0, "abc", "stop"), (1, "xyz", "length")]
    assert (result.text, result.finish_reason, result.error) == ("abc", "stop", None)
    assert result.token_ids == result.outputs[0].token_ids
    assert not any(isinstance(m, AbortRequests) for m in llm.to_scheduler.sent)


def test_generate_n1_keeps_its_shape_and_an_error_aborts_the_siblings():
    def script(k):
        if k == 0:
            return [(0, "ok", FinishReason.STOP)]
        return [(0, "a", None), (1, "", FinishReason.ERROR)]
    llm = ScriptedLLM(script)
    first, second = llm.generate(["Hi", "Ho"], [SamplingParams(), SamplingParams(n=3)])
    assert (first.text, first.finish_reason, len(first.outputs)) == ("ok", "stop", 1)
    assert second.outputs[1].finish_reason == "error" and second.outputs[2].finish_reason is None
    assert second.error == "boom"
    aborts = [m for m in llm.to_scheduler.sent if isinstance(m, AbortRequests)]
    assert len(aborts) == 1 and aborts[0].req_ids == [llm.to_scheduler.sent[1].req_id]
