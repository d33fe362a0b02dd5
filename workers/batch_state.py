"""What a worker remembers about each request between steps, so the scheduler only sends diffs."""
import os
from dataclasses import dataclass, field

import numpy as np

from tinyvllm.protocol.messages import StepPlan, TokenLogprobs
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.workers.penalties import TokenStats


@dataclass(slots=True)
class RequestState:
    token_ids: list[int]
    block_ids: list[int]
    sampling: SamplingParams
    seed: int
    num_prompt_tokens: int
    eos_token_ids: list[int] = field(default_factory=list)
    stats: TokenStats | None = None  # requests with penalties only, built when they first sample
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)  # computed, not sent yet
    pooled_sum: np.ndarray | None = None  # embedding requests: the sum of the final hidden states so far
    last_sampled: int | None = None  # sampled by this worker, not in token_ids yet (CachedRequestData.append_sampled)
    num_drafts: int = 0  # this step's drafts, the last entries of token_ids until verified (workers/spec_verify.py)
    grammar: object | None = None  # structured output: its workers.sampling_masks.GrammarState, made on first use
    thinking: object | None = None  # a reasoning reply: its workers.thinking_phase.ThinkingPhase, made on first use
    failed: str | None = None  # why this worker could not run it (its LoRA adapter): never computed again

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def token_stats(self, vocab_size: int) -> TokenStats:
        if self.stats is None:
            self.stats = TokenStats(self.token_ids, self.num_prompt_tokens, vocab_size)
        return self.stats

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.stats is not None:
            self.stats.add(token_id)


@dataclass(slots=True)
class ScheduledChunk:
    """Positions [start, start + length) of one request, computed this step."""
    req_id: str
    state: RequestState
    start: int
    length: int

    @property
    def samples(self) -> bool:
        return self.start + self.length == len(self.state.token_ids)

    @property
    def pools(self) -> bool:
        """An embedding or scoring request: nothing is sampled (an embedding's hidden states are summed)."""
        return self.state.sampling.pools

    @property
    def scores(self) -> bool:
        """A scoring request's last piece: its last position's logits of the scored tokens are its result."""
        return self.samples and bool(self.state.sampling.score_token_ids)

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Some position in the chunk predicts a prompt token whose logprobs were asked for."""
        return self.state.sampling.prompt_logprobs is not None and self.start < self.state.num_prompt_tokens - 1


@dataclass
class BatchState:
    requests: dict[str, RequestState] = field(default_factory=dict)

    def apply(self, plan: StepPlan) -> list[ScheduledChunk]:
        """Updates the remembered requests from a plan and returns this step's work, in plan order."""
        for req_id in plan.finished_req_ids:
            self.requests.pop(req_id, None)
        chunks = []
        for new in plan.new_reqs:
            seed = new.sampling.seed if new.sampling.seed is not None else int.from_bytes(os.urandom(4), "little")
            state = RequestState(list(new.prompt_token_ids), list(new.block_ids), new.sampling, seed & 0xFFFFFFFF,
                                 new.num_prompt_tokens or len(new.prompt_token_ids), list(new.eos_token_ids))
            self.requests[new.req_id] = state
            chunks.append(ScheduledChunk(new.req_id, state, new.num_computed_tokens, new.num_scheduled_tokens))
        for cached in plan.cached_reqs:
            state = self.requests[cached.req_id]
            if state.failed is not None:  # planned before its failure reached the scheduler, which ends it
                chunks.append(ScheduledChunk(cached.req_id, state, cached.num_computed_tokens, 0))
                continue
            state.block_ids.extend(cached.new_block_ids)
            for token_id in cached.new_token_ids:
                state.append_token(token_id)
            if cached.append_sampled:
                if state.last_sampled is None:
                    raise ValueError(f"{cached.req_id}: told to append a sampled token, but none was sampled")
                state.append_token(state.last_sampled)
            state.last_sampled = None
            state.token_ids.extend(cached.draft_token_ids)  # not token stats: requests with penalties get no drafts
            state.num_drafts = len(cached.draft_token_ids)
            chunks.append(ScheduledChunk(cached.req_id, state, cached.num_computed_tokens, cached.num_scheduled_tokens))
        for chunk in chunks:
            if chunk.start + chunk.length > len(chunk.state.token_ids):
                raise ValueError(f"{chunk.req_id}: scheduled past its known tokens")
        return chunks
