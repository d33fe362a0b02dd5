"""POST /rerank, /v1/rerank and /v2/rerank (vLLM's shape, which Jina's and Cohere's clients read) and /score and
/v1/score (vLLM's), over frontend/engine/rerank.py's decoder-only reranker; errors in OpenAI's shape."""
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinyvllm.frontend.api import openai_protocol as api
from tinyvllm.frontend.api import openapi
from tinyvllm.frontend.api.http_json import exception_response, read_json_object
from tinyvllm.frontend.api.openai_requests import RerankRequest, ScoreRequest
from tinyvllm.frontend.api.openai_responses import RerankResponse, ScoreResponse
from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.engine.rerank import Reranker, RerankError, ranked

RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")
SCORE_PATHS = ("/score", "/v1/score")


def score_pairs(text_1: str | list[str], text_2: str | list[str]) -> list[tuple[str, str]]:
    """vLLM's /score pairing: one text_1 against every text_2, or the two lists pairwise."""
    firsts = [text_1] if isinstance(text_1, str) else text_1
    seconds = [text_2] if isinstance(text_2, str) else text_2
    if len(firsts) == 1:
        return [(firsts[0], second) for second in seconds]
    if len(firsts) != len(seconds):
        raise api.APIError(f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: give one text_1, or as many "
                           f"as text_2", param="text_2")
    return list(zip(firsts, seconds))


def rerank_routes(engine, tokenizer, model_name: str, max_model_len: int, max_body_bytes: int) -> list[Route]:
    reranker = Reranker(engine, tokenizer, max_model_len)

    async def scored(request: Request, schema, pairs_of) -> tuple:
        req = api.validated(schema, await read_json_object(request, max_body_bytes))
        if req.model is not None and req.model != model_name:
            raise api.model_not_found(req.model)
        if engine.dead_reason is not None:
            raise EngineDeadError(engine.dead_reason)
        try:
            scores, num_tokens = await reranker.score(pairs_of(req), req.instruction,
                                                      "documents" if schema is RerankRequest else "text_2")
        except RerankError as e:
            raise api.APIError(str(e), param=e.param) from None
        return req, scores, num_tokens

    async def rerank(request: Request) -> Response:
        try:
            req, scores, num_tokens = await scored(request, RerankRequest, lambda r: [
                (r.query, d if isinstance(d, str) else d.text) for d in r.documents])
        except Exception as e:
            return exception_response(e, request.url.path)
        results = []
        for i in ranked(scores, req.top_n):
            result = {"index": i, "relevance_score": scores[i]}
            if req.return_documents:
                document = req.documents[i]
                result["document"] = {"text": document if isinstance(document, str) else document.text}
            results.append(result)
        return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}", "model": model_name,
                             "usage": {"total_tokens": num_tokens}, "results": results})

    async def score(request: Request) -> Response:
        try:
            _, scores, num_tokens = await scored(request, ScoreRequest, lambda r: score_pairs(r.text_1, r.text_2))
        except Exception as e:
            return exception_response(e, request.url.path)
        return JSONResponse({"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                             "model": model_name,
                             "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
                             "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})

    return ([Route(path, rerank, methods=["POST"]) for path in RERANK_PATHS] +
            [Route(path, score, methods=["POST"]) for path in SCORE_PATHS])


for _path in RERANK_PATHS:
    openapi.describe(_path, "POST", RerankRequest, RerankResponse, error_statuses=(400, 404, 413, 500, 503, 504),
                     summary="Rerank documents by their relevance to a query: P(yes) of a decoder-only reranker")
for _path in SCORE_PATHS:
    openapi.describe(_path, "POST", ScoreRequest, ScoreResponse, error_statuses=(400, 404, 413, 500, 503, 504),
                     summary="Score text pairs: P(yes) of a decoder-only reranker for each (text_1, text_2)")
