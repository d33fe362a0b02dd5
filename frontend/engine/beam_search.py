"""Beam search outside the engine, as vLLM V1 does it (its online `beam_search`).

Every step asks the engine for one token of every live beam, each beam a request whose prompt is the prompt plus
the beam's tokens (the prefix cache serves the shared part), with logprobs = 2 x beam_width. Every beam's top
continuations become candidates; a candidate ending in EOS is finished, the best beam_width of the rest live on.
At the end the finished and the live beams are ranked together by cumulative logprob / length ** length_penalty
(length counting the prompt, and not a final EOS: vLLM's get_beam_search_score) and the best beam_width returned.

The engine's logprobs are raw (before temperature), so temperature changes nothing here and each step is greedy.
"""
import asyncio
import math
from dataclasses import dataclass, field

from tinyvllm.frontend.engine.request_errors import EngineRequestError
from tinyvllm.protocol.messages import FinishReason, TokenLogprobs
from tinyvllm.protocol.sampling import BeamSearchParams, SamplingParams


@dataclass(slots=True)
class BeamSequence:
    token_ids: list[int] = field(default_factory=list)  # generated only; a finished beam's last is the EOS
    cumulative_logprob: float = 0.0
    ended_with_eos: bool = False


def beam_score(beam: BeamSequence, num_prompt_tokens: int, length_penalty: float) -> float:
    """Orders beams as cumulative_logprob / length ** length_penalty does, in logs so that no penalty overflows
    (a cumulative logprob is never positive)."""
    length = num_prompt_tokens + len(beam.token_ids) - (1 if beam.ended_with_eos else 0)
    loss = -beam.cumulative_logprob
    return math.inf if loss <= 0 else length_penalty * math.log(max(length, 1)) - math.log(loss)


async def _next_token_logprobs(engine, request_id: str, token_ids: list[int], width: int,
                               eos_token_ids: list[int]) -> TokenLogprobs:
    step = SamplingParams(temperature=0.0, max_tokens=1, logprobs=2 * width, ignore_eos=True)
    entry = None
    async for out in engine.generate(request_id, token_ids, step, eos_token_ids):
        if out.finish_reason == FinishReason.ERROR:
            raise EngineRequestError.from_output(out)
        if out.logprobs:
            entry = out.logprobs[0]
    if entry is None:
        raise EngineRequestError("beam search: the engine returned no logprobs")
    return entry


async def beam_search(engine, request_id: str, prompt_ids: list[int], params: BeamSearchParams,
                      eos_token_ids: list[int]) -> list[BeamSequence]:
    """The best params.beam_width beams, best first. `engine` has EngineClient's generate()."""
    width, eos = params.beam_width, set(eos_token_ids)
    live, finished = [BeamSequence()], []

    def score(beam: BeamSequence) -> float:
        return beam_score(beam, len(prompt_ids), params.length_penalty)

    for step in range(params.max_tokens):
        entries = await asyncio.gather(*(
            _next_token_logprobs(engine, f"{request_id}-{step}-{i}", prompt_ids + beam.token_ids, width,
                                 eos_token_ids)
            for i, beam in enumerate(live)))
        candidates = []
        for beam, entry in zip(live, entries):
            for token, logprob in zip(entry.top_token_ids, entry.top_logprobs):
                ends = token in eos and not params.ignore_eos
                new = BeamSequence(beam.token_ids + [token], beam.cumulative_logprob + logprob, ends)
                (finished if ends else candidates).append(new)
        live = sorted(candidates, key=score, reverse=True)[:width]
        finished = sorted(finished, key=score, reverse=True)[:width]  # a finished beam's score is final
        if not live:
            break
    return sorted(finished + live, key=score, reverse=True)[:width]
