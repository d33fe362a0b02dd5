"""POST /api/rerank, the extension other servers offer for Ollama's open request (#3368): frontend/engine/rerank.py's
decoder-only reranker, {model, query, documents, top_n, instruction} -> {model, results: [{index, document,
relevance_score}]}, most relevant first."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tinyvllm.frontend.api.ollama.http_io import OllamaError, handler, read_request
from tinyvllm.frontend.api.ollama.requests import OllamaRerankRequest
from tinyvllm.frontend.api.ollama.service import OllamaService
from tinyvllm.frontend.engine.engine_client import EngineDeadError
from tinyvllm.frontend.engine.rerank import Reranker, RerankError, ranked


def make_routes(service: OllamaService):
    reranker = Reranker(service.engine, service.tokenizer, service.max_model_len)

    @handler
    async def rerank(request: Request) -> Response:
        req = await read_request(request, OllamaRerankRequest, service.max_body_bytes)
        await service.servable(req.model_name)
        if service.engine.dead_reason is not None:
            raise EngineDeadError(service.engine.dead_reason)
        try:
            scores, _ = await reranker.score([(req.query, d) for d in req.documents], req.instruction, "documents")
        except RerankError as e:
            raise OllamaError(str(e)) from None
        return JSONResponse({"model": req.model_name, "results": [
            {"index": i, "document": req.documents[i], "relevance_score": scores[i]}
            for i in ranked(scores, req.top_n)]})

    return rerank
