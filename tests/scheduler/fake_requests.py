"""Requests and steps for the scheduler tests (fake_worker.py re-exports them)."""
import zlib

from fake_tokens import EOS, VOCAB
from invariants import check_scheduler_invariants
from tinyvllm.protocol.sampling import SamplingParams
from tinyvllm.scheduler.request import Request


def make_prompt(seed: str, length: int) -> list[int]:
    return [100 + (zlib.crc32(seed.encode()) + i) % VOCAB for i in range(length)]


def make_request(req_id: str, prompt_len: int, max_tokens: int = 16, arrival_time: float = 0.0,
                 eos_token_ids: tuple[int, ...] = (EOS,), prompt: list[int] | None = None, **sampling) -> Request:
    prompt = make_prompt(req_id, prompt_len) if prompt is None else prompt
    return Request(req_id, prompt, SamplingParams(max_tokens=max_tokens, **sampling), list(eos_token_ids), arrival_time)


def step(scheduler, worker):
    """One schedule -> execute -> update round; returns (plan, outputs by req_id)."""
    plan = scheduler.schedule()
    assert plan is not None
    outputs = scheduler.update_from_output(plan, worker.execute(plan))
    check_scheduler_invariants(scheduler)
    return plan, {out.req_id: out for out in outputs}
