"""A completion request with use_beam_search: its choices are the best beams of the engine's beam search
(frontend/engine/beam_search.py)."""
import dataclasses

from tinyvllm.frontend.api.serving import ChoiceResult, CompletionResult
from tinyvllm.frontend.engine.beam_search import beam_search
from tinyvllm.protocol.messages import FinishReason


async def beam_search_completion(serving, request_id: str, prompt_ids: list[int], req) -> CompletionResult:
    """A non-streamed completion (req: GenerationRequest with beam_search set) whose choices are the best
    n beams: finish_reason "stop" for a beam that ended with EOS, "length" otherwise."""
    params = dataclasses.replace(req.beam_search, max_tokens=req.sampling.max_tokens)  # as fit to the context
    beams = await beam_search(serving.engine, request_id, prompt_ids, params, serving.tokenizer.eos_token_ids)
    echo = serving.echo_text(req, prompt_ids)
    choices = []
    for i, beam in enumerate(beams):
        shown = beam.token_ids[:-1] if beam.ended_with_eos else beam.token_ids
        text = serving.tokenizer.decode(shown, skip_special_tokens=req.skip_special_tokens)
        choices.append(ChoiceResult(i, echo + text, FinishReason.STOP if beam.ended_with_eos else FinishReason.LENGTH,
                                    cumulative_logprob=beam.cumulative_logprob))
    return CompletionResult(choices, len(prompt_ids), sum(len(b.token_ids) for b in beams), 0)
