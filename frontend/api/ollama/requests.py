"""Ollama's request bodies (/api/*), declared once: they validate requests and are the request schemas in
/openapi.json. Errors read as Ollama's flat {"error": "..."} (http_io.as_ollama_error).

Fields Ollama has but this server refuses (images, logprobs, suffix, quantize, ...) accept only an
empty (or false) value. Limits that depend on another field or on the server (the model must exist and run on the
served weights; prompt + num_predict is cut at the context; raw excludes template, system and context) are in the
descriptions and checked by the routes; breaking them is a 400 or 404.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from tinyvllm.frontend.api.ollama import names
from tinyvllm.frontend.api.ollama.options import OllamaOptions
from tinyvllm.frontend.api.openai_requests import MAX_RERANK_DOCUMENTS, Tool
from tinyvllm.frontend.api.request_models import RequestInvalid, RequestModel, Reworded
from tinyvllm.frontend.api.tool_calls import MAX_TOOLS

_NEW_NAME = {"pattern": names.PATTERN, "description": "[host/][namespace/]model[:tag]"}
IMAGES_REFUSED = "images are not supported: this server runs text-only models"
ROLES = ("system", "user", "assistant", "tool")


def refused(message: str, kind: type = list) -> Any:
    """A field this server does not support: only its empty value is accepted, anything else reads `message`."""
    return Annotated[kind, Field(max_length=0), Reworded(message)]


Images = refused(IMAGES_REFUSED)
NoSuffix = refused("inserting (suffix) is not supported by this server", str)
NoQuantize = refused("'quantize' is not supported by this server", str)
NoMessages = refused("'messages' is not supported by this server")
Think = Annotated[bool | Literal["low", "medium", "high"] | None,
                  Reworded("'think' must be true, false, \"low\", \"medium\" or \"high\"")]
NoLogprobs = Annotated[Literal[False], Reworded("logprobs are not supported on /api/generate and /api/chat yet")]
KeepAlive = Annotated[str | float, Reworded("'keep_alive' must be a duration or a number of seconds"),
                      Field(description="how long the model stays loaded after this request (5m, 300, 0: unload "
                                        "now, -1: never) when the server serves its store on demand; a --model "
                                        "server keeps its one model loaded")]
Format = Annotated[Literal["", "json"] | dict[str, Any],
                   Reworded('invalid format: expected "json" or a JSON schema object'),
                   Field(description='"json" or a JSON schema: enforced while decoding (a grammar masks every token)')]


class NamedRequest(RequestModel):
    """A request about one model: `model`, or the older spelling `name` (model wins)."""
    model_config = ConfigDict(json_schema_extra={"required": ["model"]})

    model: str | None = Field(None, description="a model /api/tags lists (the tag defaults to latest)")
    name: str | None = Field(None, description="the older spelling of model; model wins")

    @property
    def model_name(self) -> str:
        if not (name := self.model or self.name):
            raise RequestInvalid("model is required", "model")
        return name


class GenerationFields(NamedRequest):
    format: Format = ""
    options: OllamaOptions | None = None
    stream: bool = True
    keep_alive: KeepAlive | None = None
    think: Think = Field(None, description="a reasoning model's thinking apart, in message.thinking (chat) or "
                                           "thinking (generate); false: thinking off (enable_thinking false); "
                                           "low/medium/high: on, the template's reasoning_effort")
    logprobs: NoLogprobs = False


class GenerateRequest(GenerationFields):
    prompt: str = Field("", description="empty: only (un)loads the model")
    system: str | None = None
    template: str | None = Field(None, description="Go template or jinja")
    raw: bool = Field(False, description="the prompt as is; excludes template, system and context")
    context: Annotated[list[int], Reworded("'context' must be a list of token ids"),
                       Field(default_factory=list,
                             description="a previous reply's context: token ids below the vocabulary size")]
    suffix: NoSuffix = ""
    images: Images = Field(default_factory=list)


class OllamaFunctionCall(RequestModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class OllamaToolCall(RequestModel):
    function: OllamaFunctionCall


class OllamaMessage(RequestModel):
    role: Literal[ROLES]
    content: Annotated[str, Reworded("{where} must be a string")] = ""
    images: Images = Field(default_factory=list)
    tool_calls: list[OllamaToolCall] = Field(default_factory=list, description="an assistant message's calls")
    tool_name: str | None = Field(None, description="a tool message: the function whose result it is")


class ChatRequest(GenerationFields):
    messages: list[Annotated[OllamaMessage, Reworded(f"{{where}}: 'role' must be one of {', '.join(ROLES)}")]] = \
        Field(default_factory=list, description="empty: only (un)loads the model")
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] = Field(
        default_factory=list, description="the model may answer with message.tool_calls (Hermes-style <tool_call> "
                                          "JSON, parsed)")


class EmbeddingFields(NamedRequest):
    options: OllamaOptions | None = None
    keep_alive: KeepAlive | None = None


class EmbedRequest(EmbeddingFields):
    input: Annotated[str | list[str], Reworded("'input' must be a string or a list of strings"),
                     Field(default_factory=list, description="empty strings are skipped")]
    truncate: bool = Field(True, description="cut inputs to the context (default) or 400")
    dimensions: int | None = Field(None, ge=1, description="keep the first this many; at most the model's hidden size")


class EmbeddingsRequest(EmbeddingFields):
    prompt: str = ""


class OllamaRerankRequest(EmbeddingFields):
    """The /api/rerank extension other servers offer (Ollama's open request #3368)."""
    model_config = ConfigDict(json_schema_extra={"required": ["model", "query", "documents"]})

    query: Annotated[str, Reworded("'query' must be a string", when_missing=True)]
    documents: Annotated[list[str], Field(min_length=1, max_length=MAX_RERANK_DOCUMENTS),
                         Reworded(f"'documents' must be a list of 1 to {MAX_RERANK_DOCUMENTS} strings",
                                  when_missing=True)]
    top_n: int = Field(0, ge=0, description="the best n documents; 0 or absent: all of them")
    instruction: str | None = Field(None, description="the reranker's <Instruct> line (default: web search)")


class ShowRequest(NamedRequest):
    verbose: bool = False


class CopyRequest(RequestModel):
    source: str = Field(description="a model /api/tags lists")
    destination: str = Field(json_schema_extra=_NEW_NAME)


class CreateRequest(NamedRequest):
    model: str | None = Field(None, json_schema_extra={**_NEW_NAME, "description": "the new model's name"})
    from_: str | None = Field(None, alias="from", description="a model /api/tags lists, or a GGUF file or model "
                              "folder on the server; this or files (or a Modelfile FROM) is required")
    files: Annotated[dict[str, str], Reworded("'files' must map file names to sha256 digests"),
                     Field(default_factory=dict,
                           description="file name -> the sha256 of a blob uploaded to /api/blobs")]
    modelfile: str = Field("", description="FROM, PARAMETER, TEMPLATE, SYSTEM, LICENSE, ADAPTER")
    template: str | None = None
    system: str | None = None
    license: Annotated[str | list[str], Reworded("'license' must be a string or a list of strings")] | None = None
    parameters: OllamaOptions | None = None
    stream: bool = True
    quantize: NoQuantize = ""
    adapters: Annotated[dict[str, str], Reworded("'adapters' must map file names to sha256 digests"),
                        Field(default_factory=dict, description="a LoRA adapter's files (a PEFT folder's "
                              "adapter_config.json and adapter_model.safetensors): file name -> the sha256 of a blob "
                              "uploaded to /api/blobs")]
    messages: NoMessages = Field(default_factory=list)


class PullRequest(NamedRequest):
    insecure: bool = False
    stream: bool = True
