"""The OpenAI surface beyond plain generation, through the real server on the tiny model and the official client:
logprobs (chat, completions, echo), seeds, n=2, stop strings split across real tokens, penalties, logit_bias,
min_tokens, and /v1/embeddings (float and the client's default base64), plus LLM.embed offline."""
import math

import httpx
import numpy as np

from tinyvllm.frontend.engine.llm import LLM
from tinyvllm.protocol.tokenizer import Tokenizer
from tests.e2e.http_helpers import stream
from tests.e2e.server_process import MODEL_NAME

PROMPT = "The capital of France is"
REPEATING_PROMPT = "a a a a"  # the tiny model's greedy reply to it repeats a token within 12 tokens


def greedy_completion(client, prompt: str = PROMPT, **extra):
    return client.completions.create(model=MODEL_NAME, prompt=prompt, temperature=0, **extra).choices[0]


def test_chat_logprobs_streamed_and_not(client):
    messages = [{"role": "user", "content": "Hi there"}]
    c = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_completion_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens == 4
    for item in content:
        assert len(item.top_logprobs) == 3 and item.logprob <= 0
        assert item.token == item.top_logprobs[0].token  # greedy: the most likely token was chosen
        assert math.isclose(item.logprob, item.top_logprobs[0].logprob, abs_tol=1e-5)
        assert [t.logprob for t in item.top_logprobs] == sorted((t.logprob for t in item.top_logprobs), reverse=True)
        assert sum(math.exp(t.logprob) for t in item.top_logprobs) <= 1 + 1e-4
    assert "".join(item.token for item in content) == c.choices[0].message.content
    streamed = []
    for chunk in client.chat.completions.create(model=MODEL_NAME, messages=messages, max_completion_tokens=4,
                                                temperature=0, logprobs=True, top_logprobs=3, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [(s.token, round(s.logprob, 4)) for s in streamed] == [(i.token, round(i.logprob, 4)) for i in content]


def test_completion_logprobs_and_echo(client):
    plain = greedy_completion(client, max_tokens=3, logprobs=2)
    lp = plain.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 3
    assert all(len(top) <= 3 and lp.tokens[i] in top for i, top in enumerate(lp.top_logprobs))
    echoed = greedy_completion(client, max_tokens=3, logprobs=2, echo=True)
    assert echoed.text == PROMPT + plain.text
    elp = echoed.logprobs
    num_prompt = len(elp.tokens) - 3
    assert "".join(elp.tokens[:num_prompt]) == PROMPT and num_prompt > 1
    assert elp.token_logprobs[0] is None and elp.top_logprobs[0] is None
    assert all(isinstance(x, float) and x <= 0 for x in elp.token_logprobs[1:])
    np.testing.assert_allclose(elp.token_logprobs[num_prompt:], lp.token_logprobs, atol=1e-4)
    assert elp.text_offset[num_prompt] == len(PROMPT)


def test_prompt_logprobs_agree_with_sampled_logprobs(client):
    """The echoed logprob of a prompt's last token equals the sampled logprob of that token after the rest."""
    first = greedy_completion(client, max_tokens=1, logprobs=0)
    echoed = greedy_completion(client, prompt=PROMPT + first.text, max_tokens=1, logprobs=0, echo=True)
    assert echoed.logprobs.tokens[-2] == first.text
    assert math.isclose(echoed.logprobs.token_logprobs[-2], first.logprobs.token_logprobs[0], abs_tol=1e-3)


def test_seed_reproducible_and_n2(client):
    def sampled(seed: int, n: int = 1):
        return client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=seed,
                                         n=n)
    a, b, other = sampled(42), sampled(42), sampled(43)
    assert a.choices[0].text == b.choices[0].text != other.choices[0].text
    two = sampled(42, n=2)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].text == a.choices[0].text != two.choices[1].text  # child 0 samples like n=1


def test_stop_string_split_across_tokens_is_never_streamed(server, client):
    full = greedy_completion(client, max_tokens=16, logprobs=0)
    tokens = full.logprobs.tokens
    assert "".join(tokens) == full.text
    stop = None
    for k in range(1, len(tokens) - 2):  # tail of token k, all of token k+1 (when short), head of token k+2
        middle = tokens[k + 1] if len(tokens[k + 1]) <= 4 else ""
        candidate = tokens[k][-2:] + middle + tokens[k + 2][:2]
        start = len("".join(tokens[:k + 1])) - len(tokens[k][-2:])
        if candidate.isascii() and len(candidate) >= 3 and full.text.find(candidate) == start:
            stop = candidate
            break
    assert stop is not None, tokens
    assert not any(stop in t for t in tokens)  # the real tokenizer split it
    result = stream(server.url, "/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 16,
                                                    "temperature": 0, "stop": [stop]})
    expected = full.text[:full.text.index(stop)]
    assert result.text == expected and result.finish_reason == "stop"
    last = [e for e in result.events if isinstance(e, dict) and e.get("choices")][-1]
    assert last["choices"][0]["stop_reason"] == stop
    chat_like = greedy_completion(client, max_tokens=16, stop=[stop], extra_body={"include_stop_str_in_output": True})
    assert chat_like.text == expected + stop and chat_like.finish_reason == "stop"


def test_penalties_change_the_greedy_output(client):
    base = greedy_completion(client, REPEATING_PROMPT, max_tokens=12).text
    assert greedy_completion(client, REPEATING_PROMPT, max_tokens=12, frequency_penalty=2.0).text != base
    assert greedy_completion(client, REPEATING_PROMPT, max_tokens=12, presence_penalty=2.0).text != base
    assert greedy_completion(client, REPEATING_PROMPT, max_tokens=12,
                             extra_body={"repetition_penalty": 1.5}).text != base


def test_logit_bias_forces_a_token_and_min_tokens_holds_eos(client, tiny_model):
    tokenizer = Tokenizer.from_model_path(tiny_model)
    forced = 1234
    choice = greedy_completion(client, max_tokens=4, logit_bias={str(forced): 100}, logprobs=0)
    assert choice.logprobs.tokens == [tokenizer.decode([forced])] * 4
    eos = tokenizer.eos_token_ids[0]
    held = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0,
                                     logit_bias={str(eos): 100}, extra_body={"min_tokens": 3})
    # EOS is forced, but masked until 3 tokens were generated: it ends the request as the fourth.
    assert held.choices[0].finish_reason == "stop" and held.usage.completion_tokens == 4


def test_embeddings_float_base64_and_offline(server, client, tiny_model):
    inputs = ["hello world", "a completely different sentence"]
    floats = client.embeddings.create(model=MODEL_NAME, input=inputs, encoding_format="float")
    decoded = client.embeddings.create(model=MODEL_NAME, input=inputs)  # the client asks for base64 and decodes it
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 4
    vectors = np.array([d.embedding for d in floats.data])
    assert vectors.shape == (2, 64) and [d.index for d in floats.data] == [0, 1]
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.array([d.embedding for d in decoded.data]), vectors, atol=1e-6)
    assert not np.allclose(vectors[0], vectors[1])
    ids = client.embeddings.create(model=MODEL_NAME, input=[[1, 2, 3]], encoding_format="float").data[0].embedding
    assert len(ids) == 64
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "x", "dimensions": 8}, timeout=30)
    assert r.status_code == 400 and "matryoshka" in r.json()["error"]["message"]
    with LLM(str(tiny_model), num_kv_blocks=16, max_num_seqs=2) as llm:
        offline = np.array(llm.embed(inputs))
    np.testing.assert_allclose(offline, vectors, atol=1e-5)
