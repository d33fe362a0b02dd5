"""`tinyvllm serve`'s HTTP options, declared once (protocol/knobs.py): the flags are made from these fields."""
from dataclasses import dataclass

from tinyvllm.frontend.api.auth import API_KEY_ENV
from tinyvllm.frontend.api.ollama.keep_alive import DEFAULT as DEFAULT_KEEP_ALIVE, ENV as KEEP_ALIVE_ENV
from tinyvllm.frontend.api.ollama.keep_alive import KeepAliveInvalid, keep_alive_seconds
from tinyvllm.frontend.api.reasoning import REASONING_PARSERS
from tinyvllm.frontend.api.router_registration import Registration
from tinyvllm.protocol.knobs import knob, knobs_of


def _origins(text: str) -> list[str]:
    return [o.strip() for o in text.split(",") if o.strip()]


@dataclass(slots=True)
class ServerArgs:
    """The HTTP server's options (docs/OPERATIONS.md lists every limit); `tinyvllm serve`'s flags are made from
    these declarations."""
    host: str = knob("127.0.0.1", "address to bind; 0.0.0.0 exposes the server to the network")
    port: int = knob(8000, "HTTP port")
    served_model_name: str | None = knob(None, "the model name clients use (default: from --model)")
    api_key: str | None = knob(
        None, f"require `Authorization: Bearer <key>` on every /v1 and /api route (/health and /metrics stay open); "
              f"default: the {API_KEY_ENV} environment variable (which, unlike the command line, other users cannot "
              f"see in ps), else no key", secret=True)
    models_dir: str | None = knob(
        None, "folder of the Ollama API's named models (one JSON manifest each, pointing at weights); default: the "
              "models folder in tinyvllm's cache. Without --model, every model there is served on demand: its own "
              "engine starts on the first request that names it and stops when idle (--keep-alive, "
              "--max-loaded-models)")
    max_waiting_requests: int = knob(
        512, "generation requests that may wait for their first output (being read and tokenized, or queued for the "
             "engine) before new ones get 503 with Retry-After, as Ollama's OLLAMA_MAX_QUEUE")
    request_timeout_s: float | None = knob(
        None, "seconds a generation request may take from arrival to its last token; past it, it ends with a 504 "
              "error (in a stream: an error event). Default: no limit", flag="--request-timeout")
    shutdown_timeout_s: float = knob(
        30.0, "on SIGTERM or Ctrl-C, seconds open requests get to finish (new ones get 503) before the rest end with "
              "an error and the server exits, a few seconds later; give the service manager 15 s more (Kubernetes' "
              "terminationGracePeriodSeconds, systemd's TimeoutStopSec)", flag="--shutdown-timeout")
    allowed_origins: list[str] = knob(None, "comma-separated browser origins allowed by CORS (e.g. "
                                            "http://localhost:3000 for Open WebUI; * for any); default: none",
                                      parse=_origins, default_factory=list)
    default_max_tokens: int | None = knob(
        None, "tokens a chat request may generate when it sets no limit (OpenAI max_tokens, Ollama num_predict), as "
              "vLLM's --override-generation-config max_new_tokens; Open WebUI's follow-up and tag tasks set none. "
              "Default: the rest of the context")
    reasoning_parser: str | None = knob(
        None, "how chat replies' thinking is told from their answer (reasoning_content): qwen3 (<think> blocks the "
              "reply opens), deepseek_r1 (thinking until </think>), or none (the tags stay in the content). Default: "
              "from the model's chat template, as llama.cpp does", choices=REASONING_PARSERS)
    responses_store_size: int = knob(
        0, "responses the Responses API keeps in memory for previous_response_id, GET, DELETE and background "
           "responses (least recently used out first); 0: none are kept, as vLLM's default")
    keep_alive: str | None = knob(
        None, "with --models-dir and no --model: how long a model stays loaded after its last request when the "
              "request says nothing (Ollama's keep_alive: 5m, 1h30m, 300 seconds; 0: unload at once; -1: never). "
              f"Default: the {KEEP_ALIVE_ENV} environment variable, else {DEFAULT_KEEP_ALIVE}")
    max_loaded_models: int = knob(
        0, "with --models-dir and no --model: most models loaded at once; a model that needs room unloads the least "
           "recently used idle one (never one with requests in flight). 0: as many as the free memory holds")
    lora_modules: list[str] = knob(
        None, "LoRA adapters served by name, as name=path entries (a PEFT folder, or llama.cpp's LoRA .gguf); with "
              "--enable-lora. Each is a model of /v1/models, chosen by a request's model", nargs="+",
        default_factory=list, metavar="NAME=PATH")
    startup_timeout_s: float = 900.0
    uds: str | None = None  # a unix socket to serve on instead of host:port (a model's server under --models-dir)
    registration: Registration | None = None  # --register-with: heartbeats to a `tinyvllm router`

    def validate(self) -> None:
        if self.max_waiting_requests < 1:
            raise ValueError("--max-waiting-requests must be at least 1")
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ValueError("--request-timeout must be positive")
        if self.shutdown_timeout_s < 0:
            raise ValueError("--shutdown-timeout must not be negative")
        if self.responses_store_size < 0:
            raise ValueError("--responses-store-size must not be negative")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ValueError("--default-max-tokens must be at least 1")
        if self.max_loaded_models < 0:
            raise ValueError("--max-loaded-models must not be negative")
        if self.keep_alive is not None:
            try:
                keep_alive_seconds(self.keep_alive)
            except KeepAliveInvalid as e:
                raise ValueError(f"--keep-alive: {e}") from None

    def keep_alive_s(self, environ) -> float:
        """--keep-alive, else OLLAMA_KEEP_ALIVE, else 5 minutes, in seconds."""
        text = self.keep_alive or environ.get(KEEP_ALIVE_ENV) or DEFAULT_KEEP_ALIVE
        try:
            return keep_alive_seconds(text)
        except KeepAliveInvalid as e:
            raise ValueError(f"{KEEP_ALIVE_ENV}: {e}") from None


SERVER_KNOBS = knobs_of(ServerArgs)
