"""mount_ollama: adds Ollama's routes to the app (on the same port as the OpenAI ones)."""
from __future__ import annotations

from starlette.applications import Starlette
from starlette.routing import Route

from tinyvllm.frontend.ollama import create_routes, embed_routes, generate_routes, model_routes, pull_routes
from tinyvllm.frontend.ollama import schemas  # noqa: F401 (describes these routes in /openapi.json)
from tinyvllm.frontend.ollama.model_store import ModelStore
from tinyvllm.frontend.ollama.service import OllamaService

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


def mount_ollama(app: Starlette, engine, serving, model_name: str, model_root: str | None = None,
                 models_dir: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> ModelStore:
    """engine: the EngineClient; serving: the app's RequestServing (over it). models_dir None: only the served
    model, and nothing can be created.

    Returns the model store (its openai_cards() feed /v1/models)."""
    store = ModelStore(models_dir, model_name, model_root, serving.max_model_len)
    service = OllamaService.create(engine, serving, store, max_body_bytes)
    models = model_routes.make_routes(service)
    generate, chat = generate_routes.make_routes(service)
    create, blob_exists, blob_upload = create_routes.make_routes(service)
    embed, embeddings = embed_routes.make_routes(service)
    app.router.routes.extend([
        Route("/", models["root"], methods=["GET"]),
        Route("/api/version", models["version"], methods=["GET"]),
        Route("/api/tags", models["tags"], methods=["GET"]),
        Route("/api/ps", models["ps"], methods=["GET"]),
        Route("/api/show", models["show"], methods=["POST"]),
        Route("/api/copy", models["copy"], methods=["POST"]),
        Route("/api/delete", models["delete"], methods=["DELETE"]),
        Route("/api/generate", generate, methods=["POST"]),
        Route("/api/chat", chat, methods=["POST"]),
        Route("/api/embed", embed, methods=["POST"]),
        Route("/api/embeddings", embeddings, methods=["POST"]),
        Route("/api/create", create, methods=["POST"]),
        Route("/api/pull", pull_routes.make_routes(service), methods=["POST"]),
        Route("/api/blobs/{digest}", blob_exists, methods=["HEAD"]),
        Route("/api/blobs/{digest}", blob_upload, methods=["POST"]),
    ])
    return store
