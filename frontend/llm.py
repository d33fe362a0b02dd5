"""Offline use of the same processes: `LLM(model).generate(prompts, sampling)` and `LLM.stream(prompt)`."""
import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import zmq

from frontend.detokenizer import IncrementalDetokenizer
from frontend.launcher import EngineArgs, EngineProcesses
from frontend.tokenizer import Tokenizer
from protocol.messages import AbortRequests, AddRequest, EngineReady, RequestOutput, Shutdown, StepOutputs
from protocol.sampling import SamplingParams
from protocol.transport import make_socket, recv, send


@dataclass(slots=True)
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    error: str | None = None


class LLM:
    def __init__(self, model: str | None = None, startup_timeout_s: float = 900.0, **engine_args):
        self.procs = EngineProcesses(EngineArgs(model=model, **engine_args))
        self.tokenizer = Tokenizer.from_model_path(self.procs.model_path)
        self.ctx = zmq.Context()
        self.to_scheduler = make_socket(self.ctx, zmq.PUSH, self.procs.endpoints.scheduler_input, bind=False)
        self.from_scheduler = make_socket(self.ctx, zmq.PULL, self.procs.endpoints.frontend_output, bind=True)
        self.procs.start()
        self.ready = self._wait_ready(startup_timeout_s)
        self._ids = itertools.count()

    def _wait_ready(self, timeout_s: float) -> EngineReady:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (dead := self.procs.dead_process()) is not None:
                self.shutdown()
                raise RuntimeError(f"engine failed to start: {dead}")
            if self.from_scheduler.poll(500) and isinstance(msg := recv(self.from_scheduler), EngineReady):
                return msg
        self.shutdown()
        raise TimeoutError("engine did not start in time")

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)

    def _submit(self, prompt: str | list[int], sampling: SamplingParams) -> tuple[str, list[int]]:
        sampling.validate()
        req_id, ids = f"llm-{next(self._ids)}-{uuid.uuid4().hex[:8]}", self._prompt_ids(prompt)
        send(self.to_scheduler, AddRequest(req_id, ids, sampling, self.tokenizer.eos_token_ids, time.time()))
        return req_id, ids

    def _outputs(self) -> Iterator[RequestOutput]:
        while True:
            if not self.from_scheduler.poll(1000):
                if (dead := self.procs.dead_process()) is not None:
                    raise RuntimeError(f"engine process died: {dead}")
                continue
            msg = recv(self.from_scheduler)
            if isinstance(msg, StepOutputs):
                yield from msg.outputs

    def generate(self, prompts: str | list[int] | list[str | list[int]],
                 sampling: SamplingParams | list[SamplingParams] | None = None) -> list[GenerationResult]:
        """Runs every prompt, batched by the engine, and returns the results in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling if isinstance(sampling, list) else [sampling or SamplingParams()] * len(prompts)
        pending = dict(self._submit(p, sp) for p, sp in zip(prompts, params))
        order, tokens, results = list(pending), {r: [] for r in pending}, {}
        for out in self._outputs():
            if out.req_id not in pending:
                continue
            tokens[out.req_id] += out.new_token_ids
            if out.finish_reason is not None:
                ids = tokens[out.req_id]
                results[out.req_id] = GenerationResult(pending.pop(out.req_id), ids, self.tokenizer.decode(ids),
                                                       out.finish_reason, out.error)
                if not pending:
                    break
        return [results[r] for r in order]

    def stream(self, prompt: str | list[int], sampling: SamplingParams | None = None) -> Iterator[str]:
        """Yields the text as it is generated; closing the generator early aborts the request."""
        req_id, ids = self._submit(prompt, sampling or SamplingParams())
        detok, finished = IncrementalDetokenizer(self.tokenizer, ids), False
        try:
            for out in self._outputs():
                if out.req_id != req_id:
                    continue
                if text := detok.add(out.new_token_ids):
                    yield text
                if out.finish_reason is not None:
                    finished = True
                    if out.error:
                        raise RuntimeError(out.error)
                    if tail := detok.flush():
                        yield tail
                    return
        finally:
            if not finished:
                send(self.to_scheduler, AbortRequests([req_id]))

    def shutdown(self) -> None:
        if self.ctx.closed:
            return
        try:
            send(self.to_scheduler, Shutdown("LLM.shutdown"))
        except zmq.ZMQError:
            pass
        self.procs.stop()
        self.ctx.destroy(linger=0)

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:
            pass
