"""When has a request sent its last output? With n > 1 the scheduler runs n children under the parent's id.

Every child (RequestOutput.index) ends with its own finish_reason; the request is complete once all n did.
An ERROR ends the whole request at once: it is the only output of a request refused at admission, and a
child that fails mid-run leaves its siblings without a result worth waiting for.
"""
from tinyvllm.protocol.messages import FinishReason, RequestOutput


class RequestCompletion:
    def __init__(self, n: int):
        self.n = n
        self.finished_indices: set[int] = set()
        self.error: str | None = None
        self.errored = False

    def observe(self, out: RequestOutput) -> None:
        if out.finish_reason == FinishReason.ERROR:
            self.errored = True
            self.error = out.error
        if out.finish_reason is not None:
            self.finished_indices.add(out.index)

    @property
    def done(self) -> bool:
        return self.errored or self.all_children_finished

    @property
    def all_children_finished(self) -> bool:
        """False while some child may still be running in the engine (so leaving now must abort)."""
        return len(self.finished_indices) >= self.n
