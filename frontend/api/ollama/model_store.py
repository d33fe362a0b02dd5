"""The named models: the served one, plus one small JSON manifest per name in the models folder.

    <models dir>/manifests/<name>.json   {name, source, parent, parameters, template, system, created, ...}
    <models dir>/blobs/sha256-<hex>      files uploaded with POST /api/blobs/<digest>
    <models dir>/folders/<hash>/<file>   model folders assembled from uploaded blobs (links)

A manifest points at weights (a GGUF file or a Hugging Face folder); it never copies them. A `--model` server runs one
engine, so only models whose weights are the served model's can generate (with their own parameters, system
prompt and template applied in the frontend); the others are listed, shown, copied and deleted like any other.
Without --model every stored model generates, each in a server of its own (frontend/router/model_servers.py).
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import pathlib
import shutil
import threading
import urllib.parse
from dataclasses import dataclass, field

from tinyvllm.frontend.api.ollama import model_info, names
from tinyvllm.protocol.cache_dir import cache_dir

log = logging.getLogger(__name__)


def default_models_dir() -> pathlib.Path:
    return cache_dir() / "models"


def now_rfc3339(ts: float | None = None) -> str:
    dt = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc) if ts is not None else \
        datetime.datetime.now(datetime.timezone.utc)
    return dt.isoformat().replace("+00:00", "Z")


class StoreError(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class ModelEntry:
    name: str  # full name, model:tag
    source: str | None  # absolute path of the weights: a .gguf file or a model folder
    parent: str = ""  # the model it was created or copied from
    parameters: dict = field(default_factory=dict)  # Ollama option names -> values
    template: str | None = None  # None: the weights' own chat template
    system: str | None = None
    license: str | None = None
    created: str = ""
    size: int = 0
    digest: str = ""  # sha256 (hex) of the weights: the real one for uploaded blobs, else cheap_digest's
    weights_sha256: str | None = None  # the real sha256 of a single-file source, when known
    adapter: str | None = None  # a LoRA adapter over the weights (Modelfile ADAPTER): a PEFT folder
    served: bool = False  # the model the engine runs (never written to disk)

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "served"}

    @classmethod
    def from_json(cls, data: dict) -> "ModelEntry":
        known = {f.name for f in dataclasses.fields(cls)} - {"served"}
        return cls(**{k: v for k, v in data.items() if k in known})


class ModelStore:
    def __init__(self, folder: str | pathlib.Path | None, served_name: str | None, served_path: str | None,
                 max_model_len: int):
        """served_name None: no engine (`serve --models-dir` alone, whose models each run in a server of their own)."""
        self.folder = pathlib.Path(folder).expanduser() if folder is not None else None
        self.max_model_len = max_model_len
        self.served = self._served_entry(served_name, served_path) if served_name is not None else None
        self._served_sha256: str | None = None
        self._lock = threading.Lock()

    def _served_entry(self, name: str, path: str | None) -> ModelEntry:
        """The served model; a stored model of its name and weights lends it its parameters, template and system
        prompt (how `serve --models-dir` starts a stored model's own server)."""
        entry = ModelEntry(names.full_name(name), None, served=True)
        if path is not None and pathlib.Path(path).exists():
            p = pathlib.Path(path).resolve()
            entry.source, entry.size, entry.digest = str(p), model_info.source_size(p), model_info.cheap_digest(p)
            entry.created = now_rfc3339(p.stat().st_mtime)
        else:
            entry.digest, entry.created = hashlib.sha256(name.encode()).hexdigest(), now_rfc3339()
        manifest = self._manifest_path(name)
        if manifest is not None and manifest.exists() and (stored := self._read(manifest)) is not None \
                and stored.source is not None and entry.source is not None \
                and pathlib.Path(stored.source).resolve() == pathlib.Path(entry.source):
            return dataclasses.replace(stored, served=True)
        return entry

    def is_served(self, name: str) -> bool:
        return self.served is not None and names.key(name) == names.key(self.served.name)

    # ---- reading

    def get(self, name: str) -> ModelEntry | None:
        if self.is_served(name):
            return self.served
        path = self._manifest_path(name)
        if path is None or not path.exists():
            return None
        return self._read(path)

    def require(self, name: str) -> ModelEntry:
        """The model `name`; a 404 StoreError if there is none."""
        if (entry := self.get(name)) is None:
            raise StoreError(f"model '{name}' not found", 404)
        return entry

    def list(self) -> list[ModelEntry]:
        """The served model first, then the stored ones by name."""
        return [*([self.served] if self.served is not None else []), *self.stored()]

    def stored(self) -> list[ModelEntry]:
        """The stored models by name, less the served one."""
        entries = []
        if self.folder is not None and (self.folder / "manifests").is_dir():
            for path in sorted((self.folder / "manifests").glob("*.json")):
                if (entry := self._read(path)) is not None and not self.is_served(entry.name):
                    entries.append(entry)
        return sorted(entries, key=lambda e: e.name.casefold())

    def _read(self, path: pathlib.Path) -> ModelEntry | None:
        try:
            return ModelEntry.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as e:
            log.warning("ignoring unreadable model manifest %s: %s", path, e)
            return None

    def uses_served_weights(self, entry: ModelEntry, compute: bool = True) -> bool:
        """Whether `entry` can run on this server's engine. May hash the served file once (call it off the loop)."""
        if self.served is None:
            return False
        if entry.served or (entry.source is not None and entry.source == self.served.source):
            return True
        if entry.weights_sha256 is None or self.served.source is None or entry.size != self.served.size:
            return False
        if self._served_sha256 is None and compute and pathlib.Path(self.served.source).is_file():
            with self._lock:
                self._served_sha256 = self._served_sha256 or model_info.file_sha256(pathlib.Path(self.served.source))
        return entry.weights_sha256 == self._served_sha256

    def openai_cards(self, created: int) -> list[dict]:
        """/v1/models cards for the stored models (app.py makes the served model's own card)."""
        cards = []
        for e in self.stored():
            created_at = _epoch(e.created) or created
            same = self.uses_served_weights(e, compute=False)
            cards.append({"id": names.short_name(e.name), "object": "model", "created": created_at,
                          "owned_by": "tinyvllm", "root": e.source, "parent": names.short_name(e.parent) or None,
                          "max_model_len": self.max_model_len if same else None})
        return cards

    # ---- writing

    def put(self, entry: ModelEntry) -> None:
        self.check_writable(entry.name)
        path = self._manifest_path(entry.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry.to_json(), indent=1))
        os.replace(tmp, path)

    def remove(self, name: str) -> bool:
        self.check_writable(name)
        path = self._manifest_path(name)
        if not path.exists():
            return False
        entry = self._read(path)
        path.unlink()
        if entry is not None and entry.source is not None:
            self._drop_unused_upload(entry.source)
        return True

    def check_writable(self, name: str) -> None:
        if self.folder is None:
            raise StoreError("this server has no models folder: start it with --models-dir to create, copy, "
                             "delete or pull models")
        if self.is_served(name):
            raise StoreError(f"model '{self.served.name}' is the model this server runs; it cannot be replaced "
                             "or deleted")

    def _manifest_path(self, name: str) -> pathlib.Path | None:
        if self.folder is None:
            return None
        return self.folder / "manifests" / (urllib.parse.quote(names.key(name), safe="") + ".json")

    # ---- uploaded files (POST /api/blobs)

    def blob_path(self, hex_digest: str) -> pathlib.Path:
        self.check_writable("")
        return self.folder / "blobs" / f"sha256-{hex_digest}"

    def folder_from_blobs(self, files: dict[str, str]) -> pathlib.Path:
        """A model folder whose files are links to uploaded blobs: {file name: hex digest}."""
        key = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:32]
        folder = self.folder / "folders" / key
        folder.mkdir(parents=True, exist_ok=True)
        for file_name, hex_digest in files.items():
            target = folder / file_name
            if not target.exists():
                try:
                    os.link(self.blob_path(hex_digest), target)
                except OSError:
                    target.symlink_to(self.blob_path(hex_digest))
        return folder

    def _drop_unused_upload(self, source: str) -> None:
        """Deletes a folder assembled from uploads once no manifest points into it (the blobs stay for reuse)."""
        uploads = pathlib.Path(os.path.abspath(self.folder / "folders"))
        path = pathlib.Path(os.path.abspath(source))
        if uploads not in path.parents:
            return
        top = uploads / path.relative_to(uploads).parts[0]
        in_use = (pathlib.Path(os.path.abspath(e.source)) for e in self.list() if e.source is not None)
        if not any(p == top or top in p.parents for p in in_use):
            shutil.rmtree(top, ignore_errors=True)


def _epoch(rfc3339: str) -> int | None:
    try:
        return int(datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None
