"""An in-process stand-in for frontend.engine_client.EngineClient: same methods and attributes, no processes. It is
built on the client's own request queues (engine_client.RequestQueues: generate, mark_dead, fail_open_requests).

Each request gets one producer task per child (the "scheduler"; n > 1 forks n children, as the real one does)
that puts one token per step on the request's queue, under the parent id with the child's index. Child i
cycles through `choice_replies[i]` (default: `reply_token_ids` for every child); after the reply it emits EOS
(unless ignore_eos), with made-up logprobs when asked (the token's is -1, its top k are the reply's next tokens);
an embedding request (sampling.embed) gets one output with a vector instead. It honours max_tokens,
stop_token_ids and aborts (of the whole parent), holds every first output while `hold` is clear, reports
`num_cached_tokens` on every output, keeps the cumulative prefix-cache counters in `stats`, and records what it saw
so tests can check it.
"""
import asyncio

from tinyvllm.frontend.engine.engine_client import RequestQueues
from tinyvllm.protocol.messages import (AddRequest, EngineReady, FinishReason, RequestOutput, SchedulerStats,
                                        TokenLogprobs)
from tinyvllm.protocol.sampling import SamplingParams


class FakeEngine(RequestQueues):
    def __init__(self, reply_token_ids: list[int], eos_token_id: int, max_model_len: int = 256,
                 step_delay_s: float = 0.001, fail_after: int | None = None,
                 choice_replies: list[list[int]] | None = None, num_cached_tokens: int = 0,
                 fail_kind: str | None = None):
        super().__init__()
        self.reply_token_ids = list(reply_token_ids)
        self.choice_replies = choice_replies
        self.eos_token_id = eos_token_id
        self.step_delay_s = step_delay_s
        self.fail_after = fail_after  # emit finish_reason "error" after this many tokens (embeddings: at once)
        self.num_cached_tokens = num_cached_tokens  # what the prefix cache "found" for each request
        self.fail_kind = fail_kind  # the ErrorKind of fail_after's error
        self.hold = asyncio.Event()  # every child waits for it before its first output; set: no waiting
        self.hold.set()
        self.stats = SchedulerStats(num_free_blocks=75, num_total_blocks=100)
        self.ready: EngineReady | None = EngineReady(num_blocks=100, block_size=16, max_model_len=max_model_len,
                                                     max_num_seqs=8, num_workers=1)
        self.requests: dict[str, AddRequest] = {}
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self.num_preemptions = 0  # tests may set it; reported in stats
        self._prefix_cache_queries = self._prefix_cache_hits = 0
        self._producers: dict[str, dict[int, asyncio.Task]] = {}  # parent id -> child index -> task

    async def start(self, timeout_s: float = 600.0) -> EngineReady:
        return self.ready

    async def _submit(self, req: AddRequest) -> None:
        self.requests[req.req_id] = req
        self._prefix_cache_queries += len(req.prompt_token_ids)
        self._prefix_cache_hits += self.num_cached_tokens
        q = self.queues[req.req_id]
        self._producers[req.req_id] = {
            i: asyncio.create_task(self._produce(req.req_id, i, len(req.prompt_token_ids), req.sampling, q))
            for i in range(req.sampling.n)}
        self._update_stats()

    def _reply(self, index: int) -> list[int]:
        return self.choice_replies[index % len(self.choice_replies)] if self.choice_replies else self.reply_token_ids

    async def _produce(self, req_id: str, index: int, num_prompt: int, sampling: SamplingParams,
                       q: asyncio.Queue) -> None:
        reply = self._reply(index)

        def output(token_ids: list[int], finish: str | None, error: str | None = None) -> RequestOutput:
            out = RequestOutput(req_id, token_ids, finish, num_prompt, self.num_cached_tokens, error, index)
            out.error_kind = self.fail_kind if error else None
            return out

        await self.hold.wait()

        if sampling.embed:  # as the scheduler does: one output, no token, the pooled vector
            await asyncio.sleep(self.step_delay_s)
            if self.fail_after is not None:
                q.put_nowait(output([], FinishReason.ERROR, "worker exploded"))
            else:
                q.put_nowait(RequestOutput(req_id, [], FinishReason.STOP, num_prompt, self.num_cached_tokens,
                                           embedding=self.embedding_of(num_prompt)))
        for i in range(0 if sampling.embed else sampling.max_tokens):
            await asyncio.sleep(self.step_delay_s)
            if self.fail_after is not None and i >= self.fail_after:
                q.put_nowait(output([], FinishReason.ERROR, "worker exploded"))
                break
            at_eos = i % (len(reply) + 1) == len(reply)
            if at_eos and not sampling.ignore_eos:
                token, finish = self.eos_token_id, FinishReason.STOP
            else:
                token = reply[i % len(reply)] if not at_eos else self.eos_token_id
                finish = FinishReason.STOP if token in sampling.stop_token_ids else None
            if finish is None and i == sampling.max_tokens - 1:
                finish = FinishReason.LENGTH
            out = output([token], finish)
            if (k := sampling.logprobs) is not None:
                top = [reply[(i + j) % len(reply)] for j in range(k)]
                out.logprobs = [TokenLogprobs(token, -1.0, top, [-1.0 - j for j in range(k)])]
            q.put_nowait(out)
            if finish is not None:
                break
        if (children := self._producers.get(req_id)) is not None:
            children.pop(index, None)
            if not children:
                self.finished.append(req_id)
                del self._producers[req_id]
        self._update_stats()

    @staticmethod
    def embedding_of(num_prompt_tokens: int, dim: int = 4) -> list[float]:
        """A unit vector that depends on the prompt's length (stands in for the pooled hidden states)."""
        raw = [float((num_prompt_tokens + i) % 3 + 1) for i in range(dim)]
        norm = sum(x * x for x in raw) ** 0.5
        return [x / norm for x in raw]

    def abort(self, req_ids: list[str]) -> None:
        for req_id in req_ids:
            self.aborted.append(req_id)
            for task in self._producers.pop(req_id, {}).values():
                task.cancel()
        self._update_stats()

    def _update_stats(self) -> None:
        self.stats = SchedulerStats(
            num_running=sum(len(children) for children in self._producers.values()), num_waiting=0,
            num_free_blocks=75, num_total_blocks=100, step_id=self.stats.step_id + 1,
            prefix_cache_queries=self._prefix_cache_queries, prefix_cache_hits=self._prefix_cache_hits,
            num_preemptions=self.num_preemptions)

    @property
    def num_active(self) -> int:
        """Requests with a child still producing."""
        return len(self._producers)

    async def close(self) -> None:
        for children in self._producers.values():
            for task in children.values():
                task.cancel()
