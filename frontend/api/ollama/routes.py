"""mount_ollama: adds Ollama's routes to the app (on the same port as the OpenAI ones)."""
from __future__ import annotations

from starlette.applications import Starlette
from starlette.routing import Route

from tinyvllm.frontend.api import openapi
from tinyvllm.frontend.api.ollama import (create_routes, embed_routes, generate_routes, model_routes, pull_routes,
                                          rerank_routes)
from tinyvllm.frontend.api.ollama import replies
from tinyvllm.frontend.api.ollama import requests as req
from tinyvllm.frontend.api.ollama.http_io import NDJSON
from tinyvllm.frontend.api.ollama.model_store import ModelStore
from tinyvllm.frontend.api.ollama.service import OllamaService

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


def mount_ollama(app: Starlette, engine, serving, model_name: str, model_root: str | None = None,
                 models_dir: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 adapters=None) -> ModelStore:
    """engine: the EngineClient; serving: the app's RequestServing (over it). models_dir None: only the served
    model, and nothing can be created. adapters: the engine's LoRA adapters (--enable-lora), for models made with a
    Modelfile ADAPTER.

    Returns the model store (its openai_cards() feed /v1/models)."""
    store = ModelStore(models_dir, model_name, model_root, serving.max_model_len)
    service = OllamaService.create(engine, serving, store, max_body_bytes, adapters)
    models = model_routes.make_routes(service)
    generate, chat = generate_routes.make_routes(service)
    embed, embeddings = embed_routes.make_routes(service)
    app.router.routes.extend([
        Route("/api/ps", models["ps"], methods=["GET"]),
        Route("/api/generate", generate, methods=["POST"]),
        Route("/api/chat", chat, methods=["POST"]),
        Route("/api/embed", embed, methods=["POST"]),
        Route("/api/embeddings", embeddings, methods=["POST"]),
        Route("/api/rerank", rerank_routes.make_routes(service), methods=["POST"]),
        *store_routes(service, models),
    ])
    return store


def store_routes(service: OllamaService, models: dict | None = None) -> list[Route]:
    """The routes that read and change the model store, which need no engine (`serve --models-dir` serves them
    itself): /, /api/version, /api/tags, /api/show, /api/copy, /api/delete, /api/create, /api/pull, /api/blobs."""
    models = models or model_routes.make_routes(service)
    create, blob_exists, blob_upload = create_routes.make_routes(service)
    return [
        Route("/", models["root"], methods=["GET"]),
        Route("/api/version", models["version"], methods=["GET"]),
        Route("/api/tags", models["tags"], methods=["GET"]),
        Route("/api/show", models["show"], methods=["POST"]),
        Route("/api/copy", models["copy"], methods=["POST"]),
        Route("/api/delete", models["delete"], methods=["DELETE"]),
        Route("/api/create", create, methods=["POST"]),
        Route("/api/pull", pull_routes.make_routes(service), methods=["POST"]),
        Route("/api/blobs/{digest}", blob_exists, methods=["HEAD"]),
        Route("/api/blobs/{digest}", blob_upload, methods=["POST"]),
    ]


_GENERATION_ERRORS = (400, 404, 413, 500, 503, 504)
_STORE_ERRORS = (400, 404, 413)
_DIGEST = {"digest": {"type": "string", "pattern": "^sha256[:-][0-9a-f]{64}$",
                      "description": "sha256:<64 hex digits>; anything else is a 400"}}


def _describe(path: str, method: str, request=None, response=None, **kwargs) -> None:
    kwargs.setdefault("error_statuses", _STORE_ERRORS)
    openapi.describe(path, method, request, response, error_schema=openapi.OllamaErrorBody, **kwargs)


_describe("/", "GET", summary="Ollama's liveness text", error_statuses=(), response_media_type="text/plain")
_describe("/api/version", "GET", response=replies.OllamaVersion, summary="The Ollama API version followed",
          error_statuses=())
_describe("/api/tags", "GET", response=replies.TagsReply, summary="Local models", error_statuses=())
_describe("/api/ps", "GET", response=replies.PsReply, summary="Running models: the served one", error_statuses=())
_describe("/api/show", "POST", req.ShowRequest, replies.ShowReply, summary="A model's details")
_describe("/api/copy", "POST", req.CopyRequest, summary="Copy a model", response_media_type=None)
_describe("/api/delete", "DELETE", req.NamedRequest, summary="Delete a stored model", response_media_type=None)
_describe("/api/generate", "POST", req.GenerateRequest, replies.GenerateReply, summary="Generate (stream: NDJSON)",
          stream_media_type=NDJSON, error_statuses=_GENERATION_ERRORS)
_describe("/api/chat", "POST", req.ChatRequest, replies.ChatReply, summary="Chat (stream: NDJSON)",
          stream_media_type=NDJSON, error_statuses=_GENERATION_ERRORS)
_describe("/api/embed", "POST", req.EmbedRequest, replies.EmbedReply, summary="Normalised embeddings",
          error_statuses=(*_GENERATION_ERRORS, 501))
_describe("/api/embeddings", "POST", req.EmbeddingsRequest, replies.EmbeddingsReply,
          summary="An embedding (older API)", error_statuses=(*_GENERATION_ERRORS, 501))
_describe("/api/rerank", "POST", req.OllamaRerankRequest, replies.RerankReply, error_statuses=_GENERATION_ERRORS,
          summary="Rerank documents by relevance to a query (an extension; a decoder-only reranker's P(yes))")
_describe("/api/create", "POST", req.CreateRequest, replies.StatusReply, summary="Create a model (stream: NDJSON)",
          stream_media_type=NDJSON)
_describe("/api/pull", "POST", req.PullRequest, replies.StatusReply, summary="Pull a model from this machine",
          stream_media_type=NDJSON)
openapi.describe("/api/blobs/{digest}", "HEAD", summary="Whether a blob was uploaded (200) or not (404)",
                 error_statuses=(400, 404), response_media_type=None, path_schemas=_DIGEST)
_describe("/api/blobs/{digest}", "POST", {"type": "string", "format": "binary"}, summary="Upload a blob: 201, "
          "or 200 if it was there", request_media_type=openapi.BINARY, response_media_type=None,
          success_statuses=(200, 201), error_statuses=(400,), path_schemas=_DIGEST)
