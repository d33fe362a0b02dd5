"""POST /api/pull, from what this machine already has: a model the store knows, the default model
(`smollm2-135m-instruct`), a GGUF file or model folder path, or a Hugging Face repo id in the local HF cache.
Nothing is downloaded; anything else is a 404 that says so."""
from __future__ import annotations

import asyncio
import os
import pathlib
import re

from starlette.requests import Request
from starlette.responses import Response

from tinyvllm.frontend.api.ollama import names
from tinyvllm.frontend.api.ollama.create_routes import weights_entry
from tinyvllm.frontend.api.ollama.http_io import OllamaError, handler, read_request, status_reply
from tinyvllm.frontend.api.ollama.requests import PullRequest
from tinyvllm.frontend.api.ollama.service import OllamaService
from tinyvllm.protocol.model_path import DEFAULT_MODEL_NAMES, resolve_model_path


def hf_cache_snapshot(repo_id: str) -> pathlib.Path | None:
    """The newest local snapshot of a Hugging Face repo ('org/name'), if the HF cache holds one."""
    hub = pathlib.Path(os.environ.get("HF_HUB_CACHE") or pathlib.Path(
        os.environ.get("HF_HOME") or pathlib.Path.home() / ".cache" / "huggingface") / "hub")
    snapshots = hub / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    if not snapshots.is_dir():
        return None
    candidates = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((c for c in candidates if (c / "config.json").exists() or any(c.glob("*.gguf"))), None)


def find_local(name: str) -> tuple[str, pathlib.Path] | None:
    """(model name to store it under, weights path) for a name this machine can serve, else None."""
    bare = name[: -len(":latest")] if name.endswith(":latest") else name
    try:
        if bare.lower() in DEFAULT_MODEL_NAMES:
            return "smollm2-135m-instruct", resolve_model_path(None)
        path = pathlib.Path(name).expanduser()
        if path.exists():
            stem = path.stem if path.is_file() else path.name
            return re.sub(r"[^A-Za-z0-9_.-]", "-", stem).lower() or "model", resolve_model_path(str(path))
        if names.is_valid(name) and bare.count("/") == 1 and (snapshot := hf_cache_snapshot(bare)) is not None:
            return bare, resolve_model_path(str(snapshot))
    except (FileNotFoundError, ValueError):
        return None
    return None


def make_routes(service: OllamaService):
    store = service.store

    @handler
    async def pull(request: Request) -> Response:
        req = await read_request(request, PullRequest, service.max_body_bytes)
        name, stream = req.model_name, req.stream
        entry = store.get(name)
        if entry is None:
            found = await asyncio.to_thread(find_local, name)
            if found is None:
                raise OllamaError(f"pull model manifest: model '{name}' is not available on this machine, and this "
                                  "server does not download models: pull accepts a model /api/tags lists, "
                                  "'smollm2-135m-instruct', a GGUF file or model folder path, or a Hugging Face "
                                  "repo id already in the local HF cache; or create the model from local weights "
                                  "with /api/create", 404)
            entry = store.get(found[0]) or await asyncio.to_thread(weights_entry, found[0], found[1])
            if not entry.served:
                store.put(entry)
        statuses = [{"status": "pulling manifest"},
                    {"status": f"pulling {entry.digest[:12]}", "digest": f"sha256:{entry.digest}",
                     "total": entry.size, "completed": entry.size},
                    {"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"}]
        return status_reply(statuses, stream)

    return pull
