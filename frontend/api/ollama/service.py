"""What every Ollama route needs: the engine, tokenizer, request serving, model store and limits."""
from __future__ import annotations

import asyncio
import copy
import zlib
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from tinyvllm.frontend.api.ollama.http_io import OllamaError
from tinyvllm.frontend.api.ollama.model_store import ModelEntry, ModelStore
from tinyvllm.frontend.engine.lora_adapters import LoRAAdapters
from tinyvllm.protocol.lora_adapter import LoRAError
from tinyvllm.protocol.sampling import LoRARequest


class TokenRecordingEngine:
    """Wraps the engine client to keep each request's generated token ids (for /api/generate's `context`)."""

    def __init__(self, engine):
        self._engine = engine
        self.generated: dict[str, list[int]] = {}

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def generate(self, req_id: str, prompt_token_ids, sampling, eos_token_ids, *args, **kwargs) -> AsyncIterator:
        ids = self.generated.setdefault(req_id, [])
        async with aclosing(self._engine.generate(req_id, prompt_token_ids, sampling, eos_token_ids,
                                                  *args, **kwargs)) as outputs:
            async for out in outputs:
                if out.index == 0:
                    ids.extend(out.new_token_ids)
                yield out


@dataclass
class OllamaService:
    engine: object  # EngineClient (embeddings, dead_reason)
    tokenizer: object  # protocol.tokenizer.Tokenizer
    serving: object  # a RequestServing whose engine is `recorder`
    recorder: TokenRecordingEngine
    store: ModelStore
    max_model_len: int
    max_body_bytes: int
    adapters: LoRAAdapters | None = None  # the engine's LoRA adapters (--enable-lora): Modelfile ADAPTER models

    @classmethod
    def create(cls, engine, serving, store: ModelStore, max_body_bytes: int,
               adapters: LoRAAdapters | None = None) -> "OllamaService":
        recorder = TokenRecordingEngine(serving.engine)
        own_serving = copy.copy(serving)  # same tokenizer, detokenizer and metrics; the recording engine
        own_serving.engine = recorder
        return cls(engine, serving.tokenizer, own_serving, recorder, store, serving.max_model_len, max_body_bytes,
                   adapters)

    @classmethod
    def store_only(cls, store: ModelStore, max_body_bytes: int) -> "OllamaService":
        """For the store's routes alone (routes.store_routes), where no engine runs."""
        return cls(None, None, None, None, store, 0, max_body_bytes)

    def adapter_of(self, entry: ModelEntry) -> LoRARequest | None:
        """The LoRA adapter `entry` runs with (Modelfile ADAPTER), checked against the served model; None: none."""
        if entry.adapter is None:
            return None
        adapter = entry_adapter(entry)
        self.check_adapter(entry, adapter)
        return adapter

    def check_adapter(self, entry: ModelEntry, adapter: LoRARequest | None = None) -> None:
        """A 400 unless this server runs adapters and entry's fits its model. Not checked where no engine runs, or for
        a model of other weights: their own server checks it."""
        if self.engine is None or not self.store.uses_served_weights(entry):
            return
        if self.adapters is None:
            raise OllamaError(f"model '{entry.name}' has a LoRA adapter: this server runs none (serve --enable-lora)")
        try:
            self.adapters.check(adapter or entry_adapter(entry))
        except LoRAError as e:
            raise OllamaError(str(e)) from None


    async def servable(self, name: str) -> ModelEntry:
        """The model `name`, if this server's engine can run it; 404 or 400 otherwise."""
        entry = self.store.get(name)
        if entry is None:
            raise OllamaError(f'model "{name}" not found, try pulling it first', 404)
        if not await asyncio.to_thread(self.store.uses_served_weights, entry):
            served = self.store.served.name
            raise OllamaError(f"model '{entry.name}' uses other weights ({entry.source}) than the model this server "
                              f"runs: this server serves only '{served}' (one engine per server) and models made "
                              f"from its weights; start another `tinyvllm serve --model {entry.source}` for it", 400)
        return entry


def entry_adapter(entry: ModelEntry) -> LoRARequest:
    """A stored model's adapter, its id from when the model was made: re-created, it is another adapter (its
    cached blocks and the workers' copy are not reused)."""
    return LoRARequest(entry.name, zlib.crc32(f"{entry.created}\n{entry.adapter}".encode()), entry.adapter)
