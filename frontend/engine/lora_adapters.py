"""The LoRA adapters a server or LLM knows by name (--lora-modules, POST /v1/load_lora_adapter, LLM.generate's
lora_request): each checked against the served model once, before any request with it reaches the engine, so that an
adapter that does not fit is a clear error for its request. (A folder that changes after its check fails only its
own requests, in the worker: workers/model_runner.py.)"""
import itertools
import pathlib

from tinyvllm.protocol.engine_config import LoRAConfig
from tinyvllm.protocol.lora_adapter import LoRAError, read_lora_adapter
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.protocol.sampling import LoRARequest


class LoRAAdapters:
    def __init__(self, model_path: pathlib.Path, config: LoRAConfig, served_name: str | None = None):
        """served_name: the model's own name, which no adapter may take. Raises LoRAError for a model whose
        adapters are not served (a mixture of experts) when adapters are enabled."""
        self.model_path, self.config, self.served_name = model_path, config, served_name
        self.by_name: dict[str, LoRARequest] = {}
        self._checked: set[str] = set()
        self._ids = itertools.count(1)
        self._model_config = read_model_config(model_path) if config.enable_lora else None
        if self._model_config is not None and self._model_config.n_experts:
            raise LoRAError("--enable-lora: LoRA adapters over a mixture of experts are not supported yet")

    def check(self, adapter: LoRARequest) -> None:
        """LoRAError unless the server serves adapters and this one fits the model (read once per name and path)."""
        if self._model_config is None:
            raise LoRAError(f"LoRA adapter '{adapter.name}': this server runs no adapters (serve --enable-lora)")
        try:
            adapter.validate()
        except ValueError as e:
            raise LoRAError(str(e)) from None
        if adapter.key not in self._checked:
            read_lora_adapter(adapter.path, self._model_config, self.config.max_lora_rank)
            self._checked.add(adapter.key)

    def named(self, name: str, path: str) -> LoRARequest:
        """A new adapter to register under `name` (its id the next free one)."""
        return LoRARequest(name, next(self._ids), path)

    def check_name_free(self, name: str) -> None:
        """ValueError if `name` is an adapter's already, or the model's."""
        if name in self.by_name or name == self.served_name:
            raise ValueError(f"The lora adapter '{name}' has already been loaded.")

    def add(self, adapter: LoRARequest) -> None:
        """Registers `adapter` under its name (checked first); ValueError if the name is taken."""
        self.check_name_free(adapter.name)
        self.check(adapter)
        self.by_name[adapter.name] = adapter

    def remove(self, name: str) -> bool:
        return self.by_name.pop(name, None) is not None

    def get(self, name: str | None) -> LoRARequest | None:
        return self.by_name.get(name) if name is not None else None

    def add_modules(self, entries: list[str]) -> None:
        """--lora-modules' `name=path` entries (vLLM's form)."""
        for text in entries:
            name, sep, path = text.partition("=")
            if not sep or not name.strip() or not path.strip():
                raise ValueError(f"--lora-modules takes name=path entries, not {text!r}")
            self.add(self.named(name.strip(), path.strip()))
