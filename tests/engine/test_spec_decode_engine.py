"""Speculative decoding through the real scheduler and worker processes on the default model cut to 4 layers (its
tokenizer, shapes and stored weights; tests/helpers/tiny_model.py): greedy output equals greedy without speculation
token for token (golden-style prompts, some that copy from the prompt, so drafts are proposed and accepted), with
n-gram drafts and with a draft model (the model as its own draft: its greedy proposals are the target's greedy
tokens, so nearly all are accepted); the acceptance counters appear on /metrics
under vLLM's names. (Sampled exactness: tests/workers/test_spec_verify.py's chi-square test of the verification, and
tests/workers/test_draft_model.py: a sampled row's proposals are the draft's greedy tokens, a point mass.)"""
import re

import pytest

from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.frontend.api.metrics import FrontendMetrics
from tinyvllm.protocol.sampling import SamplingParams
from tests.helpers.tiny_model import make_shallow_default_gguf
from tests.reference.test_greedy_matches_hf import LONG_TEXT

ENGINE = dict(max_num_seqs=4, max_model_len=512, num_kv_blocks=96, max_num_batched_tokens=128)
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
CODE = ("def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n"
        "    return 2 * (width + height)\n\n\n# The same two functions, with `width` renamed to `w`:\n")


def prompts(tok) -> list[list[int]]:
    chat = lambda text: tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]), add_special_tokens=False)
    return [tok.encode("The capital of France is"), tok.encode(CODE), chat("Write a haiku about the sea."),
            tok.encode(LONG_TEXT + "In summary,")]


GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(make_shallow_default_gguf(tmp_path_factory.mktemp("model") / "smollm2-4-layers.gguf", n_layers=4))


@pytest.fixture(scope="module")
def plain_engine(model, default_tokenizer) -> tuple[list[list[int]], int]:
    """(the greedy tokens without speculation, the worker's weight bytes)"""
    with LLM(model, **ENGINE) as llm:
        return [out.token_ids for out in llm.generate(prompts(default_tokenizer), GREEDY)], \
            llm.ready.worker_weight_bytes[0]


@pytest.fixture(scope="module")
def plain(plain_engine) -> list[list[int]]:
    return plain_engine[0]


def test_ngram_greedy_equals_plain_greedy_and_metrics_count(model, default_tokenizer, plain):
    ids, greedy = prompts(default_tokenizer), GREEDY
    with LLM(model, speculative_config=NGRAM, **ENGINE) as llm:
        spec = [out.token_ids for out in llm.generate(ids, greedy)]
        stats = llm.stats
        metrics = FrontendMetrics(llm._engine, "m").render()[0].decode()
    assert spec == plain
    assert 0 < stats.spec_num_accepted_tokens <= stats.spec_num_draft_tokens and stats.spec_num_drafts > 0

    def value(name: str, labels: str = 'engine="0",model_name="m"') -> float:
        return float(re.search(rf"^{re.escape(name)}{{{labels}}} (\S+)$", metrics, re.M).group(1))

    assert value("vllm:spec_decode_num_drafts_total") == stats.spec_num_drafts
    assert value("vllm:spec_decode_num_draft_tokens_total") == stats.spec_num_draft_tokens
    assert value("vllm:spec_decode_num_accepted_tokens_total") == stats.spec_num_accepted_tokens
    per_pos = [value("vllm:spec_decode_num_accepted_tokens_per_pos_total", f'engine="0",model_name="m",position="{i}"')
               for i in range(3)]
    assert sum(per_pos) == stats.spec_num_accepted_tokens and per_pos[0] > 0


def test_draft_model_greedy_equals_plain_greedy(model, default_tokenizer, plain_engine):
    plain, weight_bytes = plain_engine
    draft = {"method": "draft_model", "model": model, "num_speculative_tokens": 3}
    with LLM(model, speculative_config=draft, **ENGINE) as llm:
        spec = [out.token_ids for out in llm.generate(prompts(default_tokenizer), GREEDY)]
        stats = llm.stats
        assert llm.ready.worker_weight_bytes[0] == 2 * weight_bytes  # the draft's weights are counted too
    assert spec == plain
    assert stats.spec_num_drafts > 0 and stats.spec_num_accepted_tokens >= 0.9 * stats.spec_num_draft_tokens
    assert sum(stats.spec_accepted_per_pos) == stats.spec_num_accepted_tokens
