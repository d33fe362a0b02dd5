"""Rerank and score through the server: a tiny random Qwen3 (tests/helpers/tiny_reasoning_model.py, whose template
renders Qwen3's, thinking switched off as Qwen3-Reranker's prompt has it) served with the exact kernels; each
document's relevance equals transformers' softmax of the "no" and "yes" logits at the end of the model card's prompt
within 1e-4, through /v1/rerank (and /rerank, /v2/rerank), /score and Ollama's /api/rerank; bad input is a 400 in
each API's shape."""
import httpx
import pytest

from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S, start_server
from tests.helpers.tiny_reasoning_model import make_thinking_qwen3

QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital and largest city of France.", "The quick brown fox jumps over the lazy dog.",
             "France borders Spain, Italy and Germany.", "Berlin is the capital of Germany.", "yes", "no no no"]
INSTRUCTION = "Given a question, find the passage that answers it"
# Qwen3-Reranker's model card, spelled out (not rendered by the template the server uses)
PREFIX = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct '
          'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    folder = make_thinking_qwen3(tmp_path_factory.mktemp("reranker-qwen3"))
    server = start_server(folder, folder / "server.log", "--max-model-len", "160", "--cpu-kernels", "c")
    yield server, folder
    assert not server.stop(), server.leftover_description


def reference_scores(folder, query: str, documents: list[str], instruction: str = DEFAULT_INSTRUCTION) -> list[float]:
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3ForCausalLM
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    model = Qwen3ForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    no, yes = tokenizer.token_to_id("no"), tokenizer.token_to_id("yes")
    scores = []
    for document in documents:
        text = f"{PREFIX}<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}{SUFFIX}"
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        scores.append(torch.softmax(logits[[no, yes]], 0)[1].item())
    return scores


def post(server, path: str, **body) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=REQUEST_TIMEOUT_S)


def test_rerank_equals_transformers_yes_no_probabilities_in_order(reranker):
    server, folder = reranker
    expected = reference_scores(folder, QUERY, DOCUMENTS)
    assert max(expected) - min(expected) > 0.01  # the random model tells the documents apart
    response = post(server, "/v1/rerank", model=MODEL_NAME, query=QUERY, documents=DOCUMENTS)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == MODEL_NAME and body["usage"]["total_tokens"] > 6 * 40
    results = body["results"]
    assert [r["index"] for r in results] == sorted(range(6), key=lambda i: -expected[i])
    for r in results:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-4)
        assert r["document"] == {"text": DOCUMENTS[r["index"]]}

    best = post(server, "/v2/rerank", query=QUERY, documents=[{"text": d} for d in DOCUMENTS], top_n=2,
                return_documents=False).json()["results"]
    assert [r["index"] for r in best] == [r["index"] for r in results[:2]] and "document" not in best[0]
    assert post(server, "/rerank", query=QUERY, documents=DOCUMENTS[:1]).json()["results"][0]["relevance_score"] == \
        pytest.approx(expected[0], abs=1e-4)


def test_the_instruction_reaches_the_prompt(reranker):
    server, folder = reranker
    expected = reference_scores(folder, QUERY, DOCUMENTS[:2], INSTRUCTION)
    results = post(server, "/v1/rerank", query=QUERY, documents=DOCUMENTS[:2],
                   instruction=INSTRUCTION).json()["results"]
    assert {r["index"]: r["relevance_score"] for r in results} == {i: pytest.approx(s, abs=1e-4)
                                                                   for i, s in enumerate(expected)}


def test_score_one_to_many_and_pairwise(reranker):
    server, folder = reranker
    expected = reference_scores(folder, QUERY, DOCUMENTS[:3])
    body = post(server, "/score", model=MODEL_NAME, text_1=QUERY, text_2=DOCUMENTS[:3]).json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1, 2]
    assert [d["score"] for d in body["data"]] == [pytest.approx(s, abs=1e-4) for s in expected]
    pairwise = post(server, "/v1/score", text_1=[QUERY, "Who wrote Hamlet?"], text_2=DOCUMENTS[:2]).json()["data"]
    assert pairwise[0]["score"] == pytest.approx(expected[0], abs=1e-4)
    assert pairwise[1]["score"] == pytest.approx(reference_scores(folder, "Who wrote Hamlet?", DOCUMENTS[1:2])[0],
                                                 abs=1e-4)


def test_the_offline_llm_scores_as_the_server(reranker):
    from tinyvllm.frontend.engine.llm import LLM
    _, folder = reranker
    expected = reference_scores(folder, QUERY, DOCUMENTS[:2])
    with LLM(str(folder), max_model_len=160, num_kv_blocks=32, max_num_seqs=4, kernels="c") as llm:
        assert llm.score(QUERY, DOCUMENTS[:2]) == [pytest.approx(s, abs=1e-4) for s in expected]
        with pytest.raises(ValueError, match="maximum context length"):
            llm.score(QUERY, "word " * 200)


def test_ollama_rerank(reranker):
    server, folder = reranker
    expected = reference_scores(folder, QUERY, DOCUMENTS[:3])
    response = post(server, "/api/rerank", model=MODEL_NAME, query=QUERY, documents=DOCUMENTS[:3], top_n=1)
    assert response.status_code == 200, response.text
    (best,) = response.json()["results"]
    i = max(range(3), key=lambda i: expected[i])
    assert best == {"index": i, "document": DOCUMENTS[i], "relevance_score": pytest.approx(expected[i], abs=1e-4)}


@pytest.mark.parametrize("path, body, param", [
    ("/v1/rerank", {"query": QUERY, "documents": []}, "documents"),
    ("/v1/rerank", {"query": QUERY}, "documents"),
    ("/v1/rerank", {"documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": QUERY, "documents": ["word " * 200]}, "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": -1}, "top_n"),
    ("/v1/rerank", {"query": QUERY, "documents": [{"title": "a"}]}, "documents"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
    ("/score", {"text_1": "a"}, "text_2"),
])
def test_bad_input_is_an_openai_400(reranker, path, body, param):
    response = post(reranker[0], path, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] == "BadRequestError"


def test_ollama_bad_input_is_an_ollama_400_and_an_unknown_model_a_404(reranker):
    server = reranker[0]
    for body in ({"model": MODEL_NAME, "query": QUERY, "documents": []},
                 {"model": MODEL_NAME, "query": QUERY, "documents": ["word " * 200]}):
        response = post(server, "/api/rerank", **body)
        assert response.status_code == 400 and set(response.json()) == {"error"}, response.text
    response = post(server, "/api/rerank", model="nope", query=QUERY, documents=["a"])
    assert response.status_code == 404 and "error" in response.json()
    assert post(server, "/v1/rerank", model="nope", query=QUERY, documents=["a"]).status_code == 404
