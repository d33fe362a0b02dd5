"""Ollama's HTTP API (/api/*) on top of the same engine as the OpenAI routes.

`routes.mount_ollama` adds the routes to the app; `model_store.ModelStore` keeps the named models
(one small JSON manifest per name) that /api/tags, /api/show, /api/create, /api/copy and /api/delete work on.
"""
