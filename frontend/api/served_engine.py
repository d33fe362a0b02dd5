"""The engine as every HTTP route speaks to it: one generate() whose steps are the server's own, in order (refused
while draining; the request's n and max_tokens counted; each output ending its wait in the queue, timed for
/metrics, and cut at the request's deadline), over the engine pool's generate."""
import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from tinyvllm.frontend.api.request_gate import RequestGate, current_ticket
from tinyvllm.protocol.messages import ErrorKind, FinishReason, RequestOutput


class ServedEngine:
    def __init__(self, engine, gate: RequestGate, metrics=None):
        """engine: an EnginePool (or anything with EngineClient's generate, stats and dead_reason); gate: the
        waiting limit, deadlines and drain (an admitted request's ticket is in a context variable; without one, as
        for the offline LLM, no deadline applies); metrics: FrontendMetrics to feed, or None (embeddings are not
        counted as generations)."""
        self.engine, self.gate, self.metrics = engine, gate, metrics

    def __getattr__(self, name: str):  # stats, dead_reason, ...: the pool's
        return getattr(self.engine, name)

    async def generate(self, req_id: str, prompt_token_ids: list[int], sampling, eos_token_ids: list[int]
                       ) -> AsyncIterator[RequestOutput]:
        if self.gate.shutdown_reason is not None:
            yield RequestOutput(req_id, [], FinishReason.ERROR, error=self.gate.shutdown_reason,
                                error_kind=ErrorKind.UNAVAILABLE)
            return
        ticket = current_ticket()
        deadline = ticket.deadline if ticket is not None else None
        meter = _Meter(self.metrics, sampling) if self.metrics is not None else None
        async with aclosing(self.engine.generate(req_id, prompt_token_ids, sampling, eos_token_ids)) as outputs:
            while True:
                timeout = asyncio.timeout_at(deadline)
                try:
                    async with timeout:
                        out = await anext(outputs)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if not timeout.expired():
                        raise
                    yield RequestOutput(req_id, [], FinishReason.ERROR, error=(
                        f"The request did not finish within {self.gate.request_timeout_s:g} s "
                        f"(--request-timeout)"), error_kind=ErrorKind.TIMEOUT)
                    return
                if ticket is not None:
                    ticket.stop_waiting()
                if meter is not None:
                    meter.observe(out)
                yield out


class _Meter:
    """One request's contribution to /metrics: its n and max_tokens, its time in the scheduler's queue (once), and
    the time between consecutive token-carrying outputs of each choice (vLLM's inter-token latency)."""

    def __init__(self, metrics, sampling):
        self.metrics = metrics
        metrics.record_request_params(sampling.n, sampling.max_tokens)
        self.last_token_at: dict[int, float] = {}  # per choice: children of n > 1 produce tokens independently
        self.queue_time_recorded = False

    def observe(self, out: RequestOutput) -> None:
        if not self.queue_time_recorded and out.index == 0 and out.queue_time_s is not None:
            self.metrics.record_queue_time(out.queue_time_s)  # once per request, not per choice
            self.queue_time_recorded = True
        if out.new_token_ids:
            self.metrics.record_streamed_tokens(len(out.new_token_ids))
            now = time.monotonic()
            if (previous := self.last_token_at.get(out.index)) is not None:
                self.metrics.record_inter_token_latency(now - previous)
            self.last_token_at[out.index] = now
