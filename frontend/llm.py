"""Offline use of the same processes: `LLM(model).generate(prompts, sampling)` and `LLM.stream(prompt)`."""
import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import zmq

from tinyvllm.frontend.detokenizer import IncrementalDetokenizer
from tinyvllm.frontend.launcher import EngineArgs, EngineProcesses
from tinyvllm.frontend.request_completion import RequestCompletion
from tinyvllm.frontend.tokenizer import Tokenizer
from tinyvllm.protocol.messages import (AbortRequests, AddRequest, EngineReady, FinishReason, RequestOutput, SchedulerStats,
                               Shutdown, StepOutputs)
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.protocol.transport import make_socket, recv, send


@dataclass(slots=True)
class CompletionOutput:
    """One of a prompt's n samples."""
    index: int
    token_ids: list[int]
    text: str
    finish_reason: str | None  # None: never finished, because another sample of the request failed


@dataclass(slots=True)
class GenerationResult:
    """A prompt's result: every sample in `outputs` (SamplingParams.n of them, by index); `token_ids`, `text`
    and `finish_reason` repeat the first sample's. `error` is set when the request ended with an error."""
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    error: str | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache


class LLM:
    def __init__(self, model: str | None = None, startup_timeout_s: float = 900.0, **engine_args):
        self.procs = EngineProcesses(EngineArgs(model=model, **engine_args))
        self.tokenizer = Tokenizer.from_model_path(self.procs.model_path)
        self.ctx = zmq.Context()
        self.to_scheduler = make_socket(self.ctx, zmq.PUSH, self.procs.endpoints.scheduler_input, bind=False)
        self.from_scheduler = make_socket(self.ctx, zmq.PULL, self.procs.endpoints.frontend_output, bind=True)
        self.procs.start()
        self.ready = self._wait_ready(startup_timeout_s)
        self.stats = SchedulerStats()  # the scheduler's latest, as of the last output read
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
                self.stats = msg.stats
                yield from msg.outputs

    def generate(self, prompts: str | list[int] | list[str | list[int]],
                 sampling: SamplingParams | list[SamplingParams] | None = None) -> list[GenerationResult]:
        """Runs every prompt, batched by the engine, and returns the results in prompt order.

        With SamplingParams.n > 1 a result holds all n samples in `outputs` (its `text` and `token_ids` are
        the first sample's)."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling if isinstance(sampling, list) else [sampling or SamplingParams()] * len(prompts)
        order, prompt_ids, collected = [], {}, {}
        for prompt, sp in zip(prompts, params):
            req_id, ids = self._submit(prompt, sp)
            order.append(req_id)
            prompt_ids[req_id], collected[req_id] = ids, _SampleCollector(sp.n)
        pending = set(order)
        for out in self._outputs():
            if out.req_id not in pending:
                continue
            collector = collected[out.req_id]
            collector.add(out)
            if collector.completion.done:
                pending.discard(out.req_id)
                if not collector.completion.all_children_finished:
                    send(self.to_scheduler, AbortRequests([out.req_id]))  # an error ended it; stop the others
                if not pending:
                    break
        return [collected[r].result(prompt_ids[r], self.tokenizer) for r in order]

    def embed(self, texts: str | list[int] | list[str | list[int]]) -> list[list[float]]:
        """One vector per input: the model's final hidden states (after the final norm) mean-pooled over the
        input's tokens, then L2-normalised (frontend/embeddings.py says more)."""
        if isinstance(texts, str) or (isinstance(texts, list) and texts and isinstance(texts[0], int)):
            texts = [texts]
        order = [self._submit(text, SamplingParams(embed=True, max_tokens=1))[0] for text in texts]
        pending, vectors = set(order), {}
        for out in self._outputs():
            if out.req_id not in pending:
                continue
            pending.discard(out.req_id)
            if out.finish_reason == FinishReason.ERROR or out.embedding is None:
                send(self.to_scheduler, AbortRequests(list(pending)))
                raise RuntimeError(out.error or f"no embedding for input {order.index(out.req_id)}")
            vectors[out.req_id] = out.embedding
            if not pending:
                break
        return [vectors[req_id] for req_id in order]

    def stream(self, prompt: str | list[int], sampling: SamplingParams | None = None) -> Iterator[str]:
        """Yields the text as it is generated (one sample: n must be 1); closing the generator early aborts the
        request."""
        sampling = sampling or SamplingParams()
        if sampling.n != 1:
            raise ValueError("stream() yields one text: use generate() for n > 1")
        req_id, ids = self._submit(prompt, sampling)
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


class _SampleCollector:
    """Gathers one request's outputs, per sample index, until every sample finished or one failed."""

    def __init__(self, n: int):
        self.completion = RequestCompletion(n)
        self.token_ids: list[list[int]] = [[] for _ in range(n)]
        self.finish_reasons: list[str | None] = [None] * n
        self.num_cached_tokens = 0

    def add(self, out: RequestOutput) -> None:
        self.completion.observe(out)
        self.token_ids[out.index] += out.new_token_ids
        if out.index == 0:
            self.num_cached_tokens = out.num_cached_tokens
        if out.finish_reason is not None:
            self.finish_reasons[out.index] = out.finish_reason

    def result(self, prompt_token_ids: list[int], tokenizer: Tokenizer) -> GenerationResult:
        outputs = [CompletionOutput(i, ids, tokenizer.decode(ids), reason)
                   for i, (ids, reason) in enumerate(zip(self.token_ids, self.finish_reasons))]
        first = outputs[0]
        return GenerationResult(prompt_token_ids, first.token_ids, first.text, first.finish_reason,
                                self.completion.error, outputs, self.num_cached_tokens)
