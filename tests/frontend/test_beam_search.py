"""frontend/engine/beam_search.py against a scripted engine: which beams live, which finish at EOS, how they rank."""
import math

import pytest

from tinyvllm.frontend.engine.beam_search import BeamSequence, beam_score, beam_search
from tinyvllm.protocol.messages import FinishReason, RequestOutput, TokenLogprobs
from tinyvllm.protocol.sampling import BeamSearchParams

pytestmark = pytest.mark.anyio
EOS, PROMPT = 0, [7]
# the next tokens' logprobs after each generated prefix (most likely first); anything else: token 5 at -2
NEXT = {
    (): [(1, -0.1), (2, -0.5), (EOS, -3.0)],
    (1,): [(3, -5.0), (4, -6.0)],
    (2,): [(EOS, -0.05), (3, -0.1)],
}


class ScriptedEngine:
    def __init__(self):
        self.prompts: list[list[int]] = []

    async def generate(self, req_id, prompt_token_ids, sampling, eos_token_ids):
        self.prompts.append(list(prompt_token_ids))
        top = NEXT.get(tuple(prompt_token_ids[len(PROMPT):]), [(5, -2.0)])[:sampling.logprobs]
        entry = TokenLogprobs(top[0][0], top[0][1], [t for t, _ in top], [lp for _, lp in top])
        yield RequestOutput(req_id, [top[0][0]], FinishReason.LENGTH, logprobs=[entry])


async def test_beams_beat_greedy_and_eos_finishes_a_beam():
    engine = ScriptedEngine()
    beams = await beam_search(engine, "r", PROMPT, BeamSearchParams(beam_width=2, max_tokens=2), [EOS])
    # greedy: 1 then 3 (-5.1). Beams: 2 then 3 (-0.6 over 3 tokens) and 2 then EOS (-0.55, finished, over 2: the
    # EOS does not count), ranked by logprob / length
    assert [(b.token_ids, b.ended_with_eos) for b in beams] == [([2, 3], False), ([2, EOS], True)]
    assert [b.cumulative_logprob for b in beams] == pytest.approx([-0.6, -0.55])
    assert engine.prompts == [PROMPT, PROMPT + [1], PROMPT + [2]]  # one request per live beam and step


async def test_without_length_penalty_beams_rank_by_cumulative_logprob():
    beams = await beam_search(ScriptedEngine(), "r", PROMPT,
                              BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=0.0), [EOS])
    assert [b.token_ids for b in beams] == [[2, EOS], [2, 3]]


async def test_ignore_eos_keeps_eos_beams_alive():
    beams = await beam_search(ScriptedEngine(), "r", PROMPT,
                              BeamSearchParams(beam_width=2, max_tokens=2, ignore_eos=True, length_penalty=0.0), [EOS])
    assert [b.token_ids for b in beams] == [[2, EOS], [2, 3]]
    assert not any(b.ended_with_eos for b in beams)


def test_score_orders_as_logprob_over_length_to_the_penalty_without_overflowing():
    short, long = BeamSequence([1], -1.0), BeamSequence([1, 2, 3], -1.5)  # lengths 2 and 4 with a 1-token prompt
    assert beam_score(short, 1, 1.0) < beam_score(long, 1, 1.0)  # -0.5 < -0.375
    assert beam_score(short, 1, 0.0) > beam_score(long, 1, 0.0)  # -1.0 > -1.5
    assert beam_score(short, 1, 1e6) < beam_score(long, 1, 1e6)  # 2 ** 1e6 overflows a float
    assert beam_score(BeamSequence([1], 0.0), 1, 1.0) == math.inf


def test_beam_search_params_are_bounded():
    from tinyvllm.protocol.sampling import MAX_BEAM_WIDTH
    BeamSearchParams(MAX_BEAM_WIDTH, 1).validate()
    for width, tokens, fragment in [(0, 4, "beam_width"), (MAX_BEAM_WIDTH + 1, 4, "beam_width"), (2, 0, "max_tokens")]:
        with pytest.raises(ValueError, match=fragment):
            BeamSearchParams(width, tokens).validate()
