"""frontend/engine/rerank.py's prompts: the judge's words in a system turn, or in the user's where the template has no
system turn (Gemma's raises); a template that renders neither is a RerankError (a 400), as is a vocabulary without
single-token "yes" and "no"; a pair longer than the context stops the batch there."""
import pytest

from tinyvllm.frontend.engine.rerank import JUDGE, Reranker, RerankError, ranked


class TemplateTokenizer:
    chat_template = "a template"

    def __init__(self, refuse_roles=("system",)):
        self.refuse_roles, self.rendered = refuse_roles, []

    def apply_chat_template(self, messages, add_generation_prompt=True, **extra):
        if any(m["role"] in self.refuse_roles for m in messages):
            raise ValueError("chat template error: System role not supported")
        self.rendered.append(messages)
        return "|".join(f"{m['role']}:{m['content']}" for m in messages)

    def encode(self, text, add_special_tokens=True):
        return list(range(len(text.split())))

    def token_to_id(self, token):
        return {"no": 7, "yes": 9}.get(token)


def test_a_template_without_a_system_turn_gets_the_judge_in_the_users():
    tokenizer = TemplateTokenizer()
    Reranker(None, tokenizer, 10_000).prompt_ids("q", "d")
    (messages,) = tokenizer.rendered
    assert [m["role"] for m in messages] == ["user"] and messages[0]["content"].startswith(JUDGE)
    assert "<Query>: q\n<Document>: d" in messages[0]["content"]


def test_a_template_that_renders_nothing_is_a_rerank_error():
    with pytest.raises(RerankError, match="cannot render a rerank prompt"):
        Reranker(None, TemplateTokenizer(("system", "user")), 10_000).prompt_ids("q", "d")


def test_the_first_pair_past_the_context_stops_the_batch():
    tokenizer = TemplateTokenizer(())
    with pytest.raises(RerankError, match="maximum context length is 80") as caught:
        Reranker(None, tokenizer, 80).prompts([("q", "d"), ("q", "long " * 50), ("q", "never rendered")], None, "x")
    assert caught.value.param == "x" and len(tokenizer.rendered) == 2


def test_ranking_and_the_answer_tokens():
    assert ranked([0.1, 0.9, 0.5, 0.9], 0) == [1, 3, 2, 0] and ranked([0.1, 0.9, 0.5], 2) == [1, 2]
    assert Reranker(None, TemplateTokenizer(), 10).answer_token_ids() == [7, 9]
    tokenizer = TemplateTokenizer()
    tokenizer.token_to_id = lambda token: None
    with pytest.raises(RerankError, match='no "yes" or no "no" token'):
        Reranker(None, tokenizer, 10).answer_token_ids()
