"""What a worker remembers about each request between steps, so the scheduler only sends diffs."""
import os
from dataclasses import dataclass, field

from protocol.messages import StepPlan
from protocol.sampling import SamplingParams


@dataclass(slots=True)
class RequestState:
    token_ids: list[int]
    block_ids: list[int]
    sampling: SamplingParams
    seed: int


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
            state = RequestState(list(new.prompt_token_ids), list(new.block_ids), new.sampling, seed & 0xFFFFFFFF)
            self.requests[new.req_id] = state
            chunks.append(ScheduledChunk(new.req_id, state, new.num_computed_tokens, new.num_scheduled_tokens))
        for cached in plan.cached_reqs:
            state = self.requests[cached.req_id]
            state.block_ids.extend(cached.new_block_ids)
            chunks.append(ScheduledChunk(cached.req_id, state, cached.num_computed_tokens, cached.num_scheduled_tokens))
        for chunk in chunks:
            if chunk.start + chunk.length > len(chunk.state.token_ids):
                raise ValueError(f"{chunk.req_id}: scheduled past its known tokens")
        return chunks
