"""Parallel sampling (n > 1): one request becomes n children that share its prompt's KV blocks.

Child 0, the leader, prefills the prompt up to (not including) its last token; then the others fork off
its block table (shared by ref count) and every child computes the last prompt token itself, so each
samples its own first token. Outputs carry the parent's id and the child's index.
"""
import dataclasses

from tinyvllm.scheduler.request import Request, RequestStatus


def child_id(parent_id: str, index: int) -> str:
    return f"{parent_id}#{index}"


def child_seed(seed: int | None, index: int) -> int | None:
    """Distinct, reproducible seeds: child i gets seed + i (wrapped into int64), so child 0 samples like n=1."""
    if seed is None:
        return None
    return (seed + index + 2**63) % 2**64 - 2**63


def make_children(parent: Request) -> list[Request]:
    """n requests with n = 1 and their own seeds; the leader (index 0) holds the others as pending forks."""
    n = parent.sampling.n
    children = [
        Request(child_id(parent.req_id, i), parent.prompt_token_ids,
                dataclasses.replace(parent.sampling, n=1, seed=child_seed(parent.sampling.seed, i)),
                parent.eos_token_ids, parent.arrival_time, cache_salt=parent.cache_salt,
                parent_id=parent.req_id, index=i)
        for i in range(n)
    ]
    # With one prompt token there is nothing to share; with prompt logprobs every child computes its own.
    if parent.num_prompt_tokens > 1 and not parent.needs_every_position:
        children[0].pending_forks = children[1:]
        for child in children[1:]:
            child.status = RequestStatus.WAITING_FOR_FORK
    return children
