"""An engine wrapper that times each request's outputs for /metrics, leaving the outputs themselves untouched."""
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from tinyvllm.frontend.api.metrics import FrontendMetrics


class MeteredEngine:
    """Everything the engine has, with generate() observed: the request's n and max_tokens when it is submitted,
    and the time between consecutive token-carrying outputs of each choice (vLLM's inter-token latency)."""

    def __init__(self, engine, metrics: FrontendMetrics):
        self._engine = engine
        self._metrics = metrics

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    async def generate(self, req_id: str, prompt_token_ids: list[int], sampling, eos_token_ids: list[int],
                       *args, **kwargs) -> AsyncIterator:
        self._metrics.record_request_params(sampling.n, sampling.max_tokens)
        last_token_at: dict[int, float] = {}  # per choice: children of n > 1 produce their tokens independently
        queue_time_recorded = False
        async with aclosing(self._engine.generate(req_id, prompt_token_ids, sampling, eos_token_ids,
                                                  *args, **kwargs)) as outputs:
            async for out in outputs:
                if not queue_time_recorded and out.index == 0 and out.queue_time_s is not None:
                    self._metrics.record_queue_time(out.queue_time_s)  # once per request, not per choice
                    queue_time_recorded = True
                if out.new_token_ids:
                    self._metrics.record_streamed_tokens(len(out.new_token_ids))
                    now = time.monotonic()
                    if (previous := last_token_at.get(out.index)) is not None:
                        self._metrics.record_inter_token_latency(now - previous)
                    last_token_at[out.index] = now
                yield out
