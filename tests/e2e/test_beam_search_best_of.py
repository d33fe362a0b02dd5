"""Beam search (width 4) against brute force, and best_of ranking, on the tiny model with the real tokenizer.

Brute force: the tree of every 3-token continuation whose token at each step is among the model's top 8 after
the tokens before it (8 + 64 + 512 nodes; 2 x beam_width, what each beam search step looks at), every node's
logprob the engine's own (a max_tokens=1 request with logprobs=8). Compared: the cumulative logprob of beam
search's best beam with greedy's (>=) and with the best leaf of the tree (equal, and the same tokens).
"""
import httpx
import pytest

from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.sampling import BeamSearchParams, SamplingParams
from tests.e2e.server_process import REQUEST_TIMEOUT_S

PROMPT = "The capital of France is"
WIDTH, DEPTH = 4, 3
TOP = 2 * WIDTH


def _top_continuations(llm: LLM, prefixes: list[list[int]]) -> list[list[tuple[int, float]]]:
    results = llm.generate(prefixes, [SamplingParams(temperature=0, max_tokens=1, logprobs=TOP)
                                      for _ in prefixes])
    return [list(zip(r.outputs[0].logprobs[0].top_token_ids, r.outputs[0].logprobs[0].top_logprobs))
            for r in results]


def _leaves(llm: LLM, prompt_ids: list[int]) -> dict[tuple[int, ...], float]:
    """Every DEPTH-token path of the top-TOP tree -> its cumulative logprob."""
    level = {(): 0.0}
    for _ in range(DEPTH):
        paths = list(level)
        tops = _top_continuations(llm, [prompt_ids + list(p) for p in paths])
        level = {path + (token,): level[path] + logprob for path, top in zip(paths, tops) for token, logprob in top}
    return level


def test_beam_search_beats_greedy_and_finds_the_brute_force_best(tiny_model):
    with LLM(str(tiny_model), max_num_seqs=64, num_kv_blocks=256, max_num_batched_tokens=512) as llm:
        prompt_ids = llm.tokenizer.encode(PROMPT)
        leaves = _leaves(llm, prompt_ids)
        greedy = tuple(llm.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=DEPTH,
                                                               ignore_eos=True))[0].token_ids)
        beams = llm.beam_search(prompt_ids, BeamSearchParams(WIDTH, DEPTH, ignore_eos=True))
    assert len(beams) == WIDTH
    best = beams[0]
    assert tuple(best.token_ids) in leaves
    assert best.cumulative_logprob == pytest.approx(leaves[tuple(best.token_ids)], abs=1e-4)
    assert best.cumulative_logprob >= leaves[greedy] - 1e-4
    brute_force_best = max(leaves, key=leaves.get)
    assert tuple(best.token_ids) == brute_force_best
    assert best.cumulative_logprob == pytest.approx(leaves[brute_force_best], abs=1e-4)
    scores = [b.cumulative_logprob for b in beams]
    assert scores == sorted(scores, reverse=True)


def _complete(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, **body}, timeout=REQUEST_TIMEOUT_S)


def test_beam_search_over_http_returns_n_beams(server):
    r = _complete(server, use_beam_search=True, n=WIDTH, max_tokens=DEPTH, ignore_eos=True, temperature=0)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == list(range(WIDTH))
    assert all(c["finish_reason"] == "length" and c["text"] for c in choices)
    assert len({c["text"] for c in choices}) == WIDTH


def test_best_of_returns_the_top_n_candidates_by_cumulative_logprob(server):
    sampling = dict(max_tokens=5, seed=1234, temperature=1.0, ignore_eos=True)
    # The same seed gives the same candidates: child i samples with seed + i whether it is a choice or a candidate.
    candidates = _complete(server, n=4, logprobs=0, **sampling).json()
    cumulative = {c["text"]: sum(c["logprobs"]["token_logprobs"]) for c in candidates["choices"]}
    expected = sorted(cumulative, key=cumulative.get, reverse=True)[:2]

    r = _complete(server, n=2, best_of=4, **sampling)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["text"] for c in body["choices"]] == expected
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(c["logprobs"] is None for c in body["choices"])  # used to rank, not asked for
    assert body["usage"]["completion_tokens"] == 4 * 5  # every candidate's tokens were generated

    with_logprobs = _complete(server, n=2, best_of=4, logprobs=0, **sampling).json()["choices"]
    assert [sum(c["logprobs"]["token_logprobs"]) for c in with_logprobs] == \
        pytest.approx([cumulative[t] for t in expected], abs=1e-4)
