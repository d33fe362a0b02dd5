"""The LoRA adapters a server or LLM knows by name (--lora-modules, POST /v1/load_lora_adapter, LLM.generate's
lora_request): each checked against the served model once, before any request with it reaches the engine, so that an
adapter that does not fit is a clear error for its request, never a failed step."""
import pathlib

from tinyvllm.protocol.engine_config import LoRAConfig
from tinyvllm.protocol.lora_adapter import LoRAError, read_peft_adapter
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.protocol.sampling import LoRARequest


def parse_lora_module(text: str) -> LoRARequest:
    """`name=path` (vLLM's --lora-modules form)."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"--lora-modules takes name=path entries, not {text!r}")
    return LoRARequest(name.strip(), path.strip())


class LoRAAdapters:
    def __init__(self, model_path: pathlib.Path, config: LoRAConfig):
        self.model_path, self.config = model_path, config
        self.by_name: dict[str, LoRARequest] = {}
        self._checked: set[tuple[str, str]] = set()
        self._model_config = None

    def check(self, adapter: LoRARequest) -> None:
        """LoRAError unless the server serves adapters and this one fits the model (read once per name and path)."""
        if not self.config.enable_lora:
            raise LoRAError(f"LoRA adapter '{adapter.name}': this server runs no adapters (serve --enable-lora)")
        try:
            adapter.validate()
        except ValueError as e:
            raise LoRAError(str(e)) from None
        if (adapter.name, adapter.path) in self._checked:
            return
        if self._model_config is None:
            self._model_config = read_model_config(self.model_path)
        read_peft_adapter(adapter.path, self._model_config, self.config.max_lora_rank)
        self._checked.add((adapter.name, adapter.path))

    def add(self, adapter: LoRARequest) -> None:
        """Registers `adapter` under its name (checked first); ValueError if the name is taken."""
        if adapter.name in self.by_name:
            raise ValueError(f"The lora adapter '{adapter.name}' has already been loaded.")
        self.check(adapter)
        self.by_name[adapter.name] = adapter

    def remove(self, name: str) -> bool:
        return self.by_name.pop(name, None) is not None

    def get(self, name: str | None) -> LoRARequest | None:
        return self.by_name.get(name) if name is not None else None
