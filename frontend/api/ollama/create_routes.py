"""POST /api/create (from a model name, a GGUF file or model folder on the server, or uploaded blobs; with a
Modelfile or the JSON fields), and HEAD/POST /api/blobs/<digest> for the uploads."""
from __future__ import annotations

import asyncio
import hashlib
import os
import pathlib
import re
import uuid

from starlette.requests import Request
from starlette.responses import Response

from tinyvllm.frontend.api.ollama import go_template, model_info, modelfile, names
from tinyvllm.frontend.api.ollama.http_io import OllamaError, handler, read_request, status_reply, timestamp
from tinyvllm.frontend.api.ollama.model_store import ModelEntry, ModelStore
from tinyvllm.frontend.api.ollama.options import check_options
from tinyvllm.frontend.api.ollama.requests import CreateRequest
from tinyvllm.frontend.api.ollama.service import OllamaService
from tinyvllm.protocol.model_path import resolve_model_path

_DIGEST_RE = re.compile(r"sha256[:-]([0-9a-f]{64})")
MAX_BLOB_BYTES = 64 << 30  # an upload is model weights: large, but bounded like every other body


def parse_digest(digest: str) -> str:
    if not (m := _DIGEST_RE.fullmatch(digest)):
        raise OllamaError(f"invalid digest {digest!r}: expected sha256:<64 hex digits>")
    return m.group(1)


def weights_entry(name: str, source: pathlib.Path, sha256: str | None = None) -> ModelEntry:
    """A manifest for weights on disk; OllamaError if they are not a model this server can load."""
    try:
        model_info.read_weights_info(source)
    except (OSError, ValueError, KeyError) as e:
        raise OllamaError(f"{source} is not a model this server can load: {e}") from None
    size = model_info.source_size(source)
    return ModelEntry(names.full_name(name), str(source), created=timestamp(), size=size,
                      digest=sha256 or model_info.cheap_digest(source), weights_sha256=sha256)


def local_source(path_text: str) -> pathlib.Path:
    try:
        return resolve_model_path(path_text)
    except (FileNotFoundError, ValueError) as e:
        raise OllamaError(str(e)) from None


def uploaded_folder(store: ModelStore, files: dict[str, str]) -> tuple[pathlib.Path, dict[str, str]]:
    """The folder of uploaded blobs `files` (file name -> digest) under their names, and the names' hex digests."""
    digests = {file_name: parse_digest(d) for file_name, d in files.items()}
    for file_name, hex_digest in digests.items():
        if pathlib.Path(file_name).name != file_name:
            raise OllamaError(f"invalid file name {file_name!r}")
        if not store.blob_path(hex_digest).exists():
            raise OllamaError(f"blob sha256:{hex_digest} ({file_name}) was not uploaded: POST it to /api/blobs first")
    return store.folder_from_blobs(digests), digests  # links named as uploaded: readers go by the .gguf suffix


def base_from_files(store: ModelStore, name: str, files: dict[str, str]) -> ModelEntry:
    folder, digests = uploaded_folder(store, files)
    if len(digests) == 1 and (file_name := next(iter(digests))).endswith(".gguf"):
        return weights_entry(name, folder / file_name, digests[file_name])
    return weights_entry(name, local_source(str(folder)))


def base_from(store: ModelStore, name: str, from_: str) -> ModelEntry:
    if (entry := store.get(from_)) is not None:
        return ModelEntry(names.full_name(name), entry.source, entry.name, dict(entry.parameters), entry.template,
                          entry.system, entry.license, timestamp(), entry.size, entry.digest, entry.weights_sha256,
                          adapter=entry.adapter)
    if not pathlib.Path(from_).expanduser().exists():
        raise OllamaError(f"model '{from_}' not found: 'from' must name a model that /api/tags lists, or a GGUF "
                          "file or model folder on the server", 404)
    return weights_entry(name, local_source(from_))


def license_text(value: str | list[str] | None) -> str | None:
    return "\n".join(value) if isinstance(value, list) else value


def make_routes(service: OllamaService):
    store = service.store

    @handler
    async def create(request: Request) -> Response:
        req = await read_request(request, CreateRequest, service.max_body_bytes)
        name = req.model_name
        if not names.is_valid(name):
            raise OllamaError(f'invalid model name "{name}"')
        mf = modelfile.parse(req.modelfile)
        from_, files = req.from_ or mf.from_, req.files
        if not from_ and not files:
            raise OllamaError("neither 'from' nor 'files' was specified")
        store.check_writable(name)  # no models folder, or the served name: 400 before any work
        if files:
            entry = await asyncio.to_thread(base_from_files, store, name, files)
        else:
            entry = await asyncio.to_thread(base_from, store, name, from_)
        entry.parameters = {**entry.parameters, **mf.parameters, **check_options(req.parameters)}
        entry.template = req.template or mf.template or entry.template
        entry.system = req.system or mf.system or entry.system
        entry.license = license_text(req.license) or mf.license or entry.license
        if req.adapters:  # a PEFT folder's files, or one llama.cpp LoRA .gguf (what the ollama CLI uploads)
            folder, digests = await asyncio.to_thread(uploaded_folder, store, req.adapters)
            only = next(iter(digests)) if len(digests) == 1 else ""
            entry.adapter = str(folder / only if only.endswith(".gguf") else folder)
        elif mf.adapter:
            entry.adapter = str(pathlib.Path(mf.adapter).expanduser().resolve())
        if entry.adapter is not None:
            await asyncio.to_thread(service.check_adapter, entry)
        if entry.template and "{%" not in entry.template:
            go_template.validate(entry.template)
        store.put(entry)
        statuses = [{"status": "using existing layer sha256:" + entry.digest}]
        for part in (entry.template, entry.system, entry.license, entry.parameters and str(entry.parameters)):
            if part:
                statuses.append({"status": "creating new layer sha256:" + hashlib.sha256(part.encode()).hexdigest()})
        statuses += [{"status": "writing manifest"}, {"status": "success"}]
        return status_reply(statuses, req.stream)

    @handler
    async def blob_exists(request: Request) -> Response:
        path = store.blob_path(parse_digest(request.path_params["digest"]))
        return Response(status_code=200 if path.exists() else 404)

    @handler
    async def blob_upload(request: Request) -> Response:
        expected = parse_digest(request.path_params["digest"])
        path = store.blob_path(expected)
        if path.exists():
            return Response(status_code=200)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BLOB_BYTES:
            raise OllamaError(f"upload too large: at most {MAX_BLOB_BYTES} bytes", 413)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial, digest, size = path.with_name(f"{path.name}.partial-{uuid.uuid4().hex}"), hashlib.sha256(), 0
        try:
            with open(partial, "wb") as f:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > MAX_BLOB_BYTES:
                        raise OllamaError(f"upload too large: at most {MAX_BLOB_BYTES} bytes", 413)
                    digest.update(chunk)
                    f.write(chunk)
            if digest.hexdigest() != expected:
                raise OllamaError(f"digest mismatch: the upload's sha256 is {digest.hexdigest()}, expected {expected}")
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        return Response(status_code=201)

    return create, blob_exists, blob_upload
