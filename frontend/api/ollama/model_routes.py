"""GET / and /api/version, /api/tags, /api/ps; POST /api/show, /api/copy; DELETE /api/delete."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import pathlib

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from tinyvllm.frontend.api.ollama import model_info, modelfile, names
from tinyvllm.frontend.api.ollama.http_io import OllamaError, handler, read_request, timestamp
from tinyvllm.frontend.api.ollama.model_store import ModelEntry
from tinyvllm.frontend.api.ollama.requests import CopyRequest, NamedRequest, ShowRequest
from tinyvllm.frontend.api.ollama.service import OllamaService
from tinyvllm.protocol.device_kind import is_cpu_device

log = logging.getLogger(__name__)
# The Ollama release whose API these routes follow; clients gate features on it.
OLLAMA_API_VERSION = "0.12.0"
NEVER_EXPIRES = "2318-01-01T00:00:00Z"  # /api/ps: the served model is never unloaded
_NO_DETAILS = {"parent_model": "", "format": "", "family": "", "families": None, "parameter_size": "",
               "quantization_level": ""}


def weights_info(entry: ModelEntry) -> model_info.WeightsInfo | None:
    if entry.source is None:
        return None
    try:
        return model_info.read_weights_info(pathlib.Path(entry.source))
    except (OSError, ValueError, KeyError) as e:
        log.warning("cannot read the weights of %s (%s): %s", entry.name, entry.source, e)
        return None


def details(entry: ModelEntry, info: model_info.WeightsInfo | None) -> dict:
    return info.details(entry.parent) if info is not None else {**_NO_DETAILS, "parent_model": entry.parent}


def tag_entry(entry: ModelEntry) -> dict:
    return {"name": entry.name, "model": entry.name, "modified_at": entry.created, "size": entry.size,
            "digest": entry.digest, "details": details(entry, weights_info(entry))}


def vram_bytes(engine, size: int) -> int:
    """/api/ps's size_vram: the model's bytes on a GPU, 0 on a CPU (what `ollama ps` turns into "100% GPU" or
    "100% CPU"); the whole size while the engine has not said which device it runs on."""
    ready = getattr(engine, "ready", None)
    device = getattr(ready, "device", "") or ""
    return 0 if is_cpu_device(device) else size


def make_routes(service: OllamaService):
    store = service.store

    async def root(request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def version(request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_API_VERSION})

    @handler
    async def tags(request: Request) -> Response:
        entries = await asyncio.to_thread(lambda: [tag_entry(e) for e in store.list()])
        return JSONResponse({"models": entries})

    @handler
    async def ps(request: Request) -> Response:
        served = store.served
        entry = {**tag_entry(served), "expires_at": NEVER_EXPIRES, "size_vram": vram_bytes(service.engine, served.size),
                 "context_length": service.max_model_len}
        del entry["modified_at"]
        return JSONResponse({"models": [entry]})

    @handler
    async def show(request: Request) -> Response:
        req = await read_request(request, ShowRequest, service.max_body_bytes)
        name, verbose = req.model_name, req.verbose
        entry = store.require(name)
        info = await asyncio.to_thread(weights_info, entry)
        default_template = getattr(service.tokenizer, "chat_template", None) if entry.served else None
        template = entry.template or (info.chat_template if info else None) or default_template or ""
        reply = {"license": entry.license or "",
                 "modelfile": modelfile.render(entry.name, entry.source or entry.name, entry.template, entry.system,
                                               entry.parameters, entry.license, entry.adapter),
                 "parameters": modelfile.parameters_text(entry.parameters), "template": template}
        if entry.system:
            reply["system"] = entry.system
        model_info_ = dict(info.model_info) if info else {}
        if info and verbose:
            model_info_.update(info.arrays)
        reply.update(details=details(entry, info), model_info=model_info_, capabilities=["completion"],
                     modified_at=entry.created)
        return JSONResponse(reply)

    @handler
    async def copy(request: Request) -> Response:
        req = await read_request(request, CopyRequest, service.max_body_bytes)
        source, destination = req.source, req.destination
        if not names.is_valid(destination):
            raise OllamaError(f'destination "{destination}" is invalid')
        entry = store.require(source)
        store.put(dataclasses.replace(entry, name=names.full_name(destination), parent=entry.name,
                                      created=timestamp(), served=False))
        return Response(status_code=200)

    @handler
    async def delete(request: Request) -> Response:
        name = (await read_request(request, NamedRequest, service.max_body_bytes)).model_name
        store.require(name)
        store.remove(name)
        return Response(status_code=200)

    return {"root": root, "version": version, "tags": tags, "ps": ps, "show": show, "copy": copy, "delete": delete}
