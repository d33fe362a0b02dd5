"""An in-process stand-in for frontend.engine_client.EngineClient: same methods and attributes, no processes.

Each request gets a producer task (the "scheduler") that puts one token per step on the request's queue,
cycling through `reply_token_ids`; after the reply it emits EOS (unless ignore_eos). It honours max_tokens,
stop_token_ids and aborts, and records what it saw so tests can check it.
"""
import asyncio
from collections.abc import AsyncIterator

from frontend.engine_client import EngineDeadError
from protocol.messages import AddRequest, EngineReady, FinishReason, RequestOutput, SchedulerStats
from protocol.sampling import SamplingParams


class FakeEngine:
    def __init__(self, reply_token_ids: list[int], eos_token_id: int, max_model_len: int = 256,
                 step_delay_s: float = 0.001, fail_after: int | None = None):
        self.reply_token_ids = list(reply_token_ids)
        self.eos_token_id = eos_token_id
        self.step_delay_s = step_delay_s
        self.fail_after = fail_after  # emit finish_reason "error" after this many tokens
        self.queues: dict[str, asyncio.Queue] = {}
        self.stats = SchedulerStats(num_free_blocks=75, num_total_blocks=100)
        self.ready: EngineReady | None = EngineReady(num_blocks=100, block_size=16, max_model_len=max_model_len,
                                                     max_num_seqs=8, num_workers=1)
        self.dead_reason: str | None = None
        self.requests: dict[str, AddRequest] = {}
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self._producers: dict[str, asyncio.Task] = {}

    async def start(self, timeout_s: float = 600.0) -> EngineReady:
        return self.ready

    def mark_dead(self, reason: str) -> None:
        self.dead_reason = reason
        for req_id, q in self.queues.items():
            q.put_nowait(RequestOutput(req_id, [], FinishReason.ERROR, error=reason))

    async def generate(self, req_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                       eos_token_ids: list[int]) -> AsyncIterator[RequestOutput]:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        if req_id in self.queues:
            raise ValueError(f"duplicate request id {req_id}")
        q: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.queues[req_id] = q
        finished = False
        try:
            self.requests[req_id] = AddRequest(req_id, list(prompt_token_ids), sampling, list(eos_token_ids))
            self._producers[req_id] = asyncio.create_task(self._produce(req_id, len(prompt_token_ids), sampling, q))
            self._update_stats()
            while not finished:
                out = q.get_nowait() if not q.empty() else await q.get()
                finished = out.finish_reason is not None
                yield out
        finally:
            del self.queues[req_id]
            if not finished and self.dead_reason is None:
                self.abort([req_id])

    async def _produce(self, req_id: str, num_prompt: int, sampling: SamplingParams, q: asyncio.Queue) -> None:
        for i in range(sampling.max_tokens):
            await asyncio.sleep(self.step_delay_s)
            if self.fail_after is not None and i >= self.fail_after:
                q.put_nowait(RequestOutput(req_id, [], FinishReason.ERROR, num_prompt, error="worker exploded"))
                break
            at_eos = i % (len(self.reply_token_ids) + 1) == len(self.reply_token_ids)
            if at_eos and not sampling.ignore_eos:
                token, finish = self.eos_token_id, FinishReason.STOP
            else:
                token = self.reply_token_ids[i % len(self.reply_token_ids)] if not at_eos else self.eos_token_id
                finish = FinishReason.STOP if token in sampling.stop_token_ids else None
            if finish is None and i == sampling.max_tokens - 1:
                finish = FinishReason.LENGTH
            q.put_nowait(RequestOutput(req_id, [token], finish, num_prompt))
            if finish is not None:
                break
        self.finished.append(req_id)
        self._producers.pop(req_id, None)
        self._update_stats()

    def abort(self, req_ids: list[str]) -> None:
        for req_id in req_ids:
            self.aborted.append(req_id)
            if (task := self._producers.pop(req_id, None)) is not None:
                task.cancel()
        self._update_stats()

    def _update_stats(self) -> None:
        self.stats = SchedulerStats(num_running=len(self._producers), num_waiting=0, num_free_blocks=75,
                                    num_total_blocks=100, step_id=self.stats.step_id + 1)

    @property
    def num_active(self) -> int:
        return len(self._producers)

    async def close(self) -> None:
        for task in self._producers.values():
            task.cancel()
