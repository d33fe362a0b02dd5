"""Speculative decoding, the scheduler's half (vLLM V1's design): a proposer drafts up to k tokens for a decoding
request, host side; the step computes the request's last known token and the drafts (1 + k positions, each with a
KV slot); the worker verifies them (workers/spec_verify.py) and returns the drafts it accepted, then its own token.

The scheduler advances num_computed_tokens by the real token and the accepted drafts only: the rejected drafts'
KV slots are rolled back by not counting them (the next step overwrites them). Their blocks stay with the request
(a block table the workers hold only grows), and the next step's tokens fill them.

Drafts are proposed only for a request in no step in flight, so the engine runs without async scheduling when
speculating (the launcher turns it off), and only for requests whose sampling per position needs nothing but the
tokens before it: no penalties (their token counts would include drafts), no logprobs (one per token, per row), no
grammar (the draft positions are sampled without its masks).

With a draft model ("draft_model") the worker proposes: it runs the draft model over every step's tokens and, right
after sampling, k greedy forwards from each such request's newest token (workers/draft_model.py); the step's result
carries those proposals, and the next step verifies them. Those forwards write KV slots past the step's tokens, so a
request that may speculate holds k slots more than it computes (vLLM's num_lookahead_tokens): a step computing
positions p..p+k has the draft write up to p+2k.
"""
from typing import Protocol

from tinyvllm.protocol.messages import SchedulerStats
from tinyvllm.protocol.speculative_config import SpeculativeConfig, may_draft
from tinyvllm.scheduler.request import Request, RequestStatus


class Proposer(Protocol):
    def propose(self, req: Request, max_drafts: int) -> list[int]:
        """Up to max_drafts tokens likely to follow req's tokens (maybe none)."""


class NgramProposer:
    """Prompt lookup: the longest suffix of the tokens (prompt_lookup_max down to prompt_lookup_min tokens) that
    occurred before; the tokens that followed its latest earlier occurrence are the drafts."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, req: Request, max_drafts: int) -> list[int]:
        return self.lookup(req.all_token_ids, max_drafts)

    def lookup(self, token_ids: list[int], max_drafts: int) -> list[int]:
        length = len(token_ids)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = token_ids[length - n:]
            for start in range(length - n - 1, -1, -1):
                if token_ids[start:start + n] == suffix:
                    return token_ids[start + n:start + n + max_drafts]
        return []


class DraftModelProposer:
    """The draft model's greedy tokens, which the worker proposed right after the step that gave req its newest
    token (StepResult.proposed_draft_ids, kept on the request); none if they follow other tokens (or none came)."""

    def propose(self, req: Request, max_drafts: int) -> list[int]:
        return req.proposed_draft_ids[:max_drafts] if req.proposed_for == req.num_tokens else []


def make_proposer(config: SpeculativeConfig) -> Proposer:
    if config.method == "draft_model":
        return DraftModelProposer()
    return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)


class SpecDecode:
    def __init__(self, config: SpeculativeConfig | None):
        self.config = config
        self.proposer = make_proposer(config) if config is not None else None
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * (config.num_speculative_tokens if config is not None else 0)

    def plan_drafts(self, req: Request, start: int, num_new: int, budget: int, max_len: int, may_draft: bool) -> int:
        """The tokens req computes this step: num_new, plus the drafts proposed for it (kept in req.draft_token_ids).
        may_draft: the workers hold req (drafts go with a CachedRequestData) and no step in flight does."""
        req.draft_token_ids = []
        if (self.proposer is None or not may_draft or num_new != 1 or start != req.num_tokens - 1
                or not may_speculate(req)):
            return num_new
        max_drafts = min(self.config.num_speculative_tokens, budget - 1,
                         req.sampling.max_tokens - req.num_output_tokens - 1, max_len - req.num_tokens - 1)
        if max_drafts > 0:
            req.draft_token_ids = self.proposer.propose(req, max_drafts)
        return num_new + len(req.draft_token_ids)

    def take_accepted(self, req: Request, accepted: list[int]) -> list[int]:
        """The drafts the worker accepted for req (checked: a prefix of what was proposed), counted in the metrics;
        req's drafts are done with."""
        drafts, req.draft_token_ids = req.draft_token_ids, []
        if accepted != drafts[:len(accepted)]:
            raise ValueError(f"{req.req_id}: the worker accepted {accepted}, not a prefix of the drafts {drafts}")
        if drafts:
            self.num_drafts += 1
            self.num_draft_tokens += len(drafts)
            self.num_accepted_tokens += len(accepted)
            for pos in range(len(accepted)):
                self.accepted_per_pos[pos] += 1
        return accepted

    def keep_proposals(self, req: Request, proposed: list[list[int]], row: int) -> None:
        """The draft model's proposals for req (row `row` of a step's result), after its new tokens were appended."""
        req.proposed_draft_ids, req.proposed_for = (proposed[row], req.num_tokens) if proposed else ([], -1)

    def slots_for(self, req: Request, num_tokens: int, max_len: int) -> int:
        """The KV slots req holds to compute num_tokens tokens: with a draft model, up to k more for the proposals'
        forwards after the step, if req may speculate. Never past max_len - 1: a forward at position q proposes the
        token at q + 1, which must be below max_len (and max_len - 1 slots fit the pool: Scheduler.max_len)."""
        if self.config is None or self.config.method != "draft_model" or not may_draft(req.sampling):
            return num_tokens
        return max(num_tokens, min(num_tokens + self.config.num_speculative_tokens, max_len - 1))

    def add_stats(self, stats: SchedulerStats) -> SchedulerStats:
        stats.spec_num_drafts, stats.spec_num_draft_tokens = self.num_drafts, self.num_draft_tokens
        stats.spec_num_accepted_tokens = self.num_accepted_tokens
        stats.spec_accepted_per_pos = list(self.accepted_per_pos)
        return stats


def may_speculate(req: Request) -> bool:
    return req.status is RequestStatus.RUNNING and req.num_output_tokens > 0 and may_draft(req.sampling)
