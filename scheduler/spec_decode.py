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
"""
from typing import Protocol

from tinyvllm.protocol.messages import SchedulerStats
from tinyvllm.protocol.speculative_config import SpeculativeConfig
from tinyvllm.scheduler.request import Request, RequestStatus


class Proposer(Protocol):
    def propose(self, token_ids: list[int], max_drafts: int) -> list[int]:
        """Up to max_drafts tokens likely to follow token_ids (maybe none)."""


class NgramProposer:
    """Prompt lookup: the longest suffix of the tokens (prompt_lookup_max down to prompt_lookup_min tokens) that
    occurred before; the tokens that followed its latest earlier occurrence are the drafts."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, token_ids: list[int], max_drafts: int) -> list[int]:
        length = len(token_ids)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = token_ids[length - n:]
            for start in range(length - n - 1, -1, -1):
                if token_ids[start:start + n] == suffix:
                    return token_ids[start + n:start + n + max_drafts]
        return []


def make_proposer(config: SpeculativeConfig) -> Proposer:
    # a draft model proposer would go here: it needs its own KV and forward, on the workers
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
            req.draft_token_ids = self.proposer.propose(req.all_token_ids, max_drafts)
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

    def add_stats(self, stats: SchedulerStats) -> SchedulerStats:
        stats.spec_num_drafts, stats.spec_num_draft_tokens = self.num_drafts, self.num_draft_tokens
        stats.spec_num_accepted_tokens = self.num_accepted_tokens
        stats.spec_accepted_per_pos = list(self.accepted_per_pos)
        return stats


def may_speculate(req: Request) -> bool:
    s = req.sampling
    return (req.status is RequestStatus.RUNNING and req.num_output_tokens > 0 and not s.embed
            and s.logprobs is None and not s.uses_penalties and s.grammar is None)
