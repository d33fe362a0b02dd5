"""The OpenAI-style request bodies (/v1/completions, /v1/chat/completions, /v1/embeddings, /v1/rerank, /score,
/tokenize, /detokenize),
declared once: they validate requests and are the request schemas in /openapi.json.

Limits that depend on another field or on the server (min_tokens <= max_tokens, best_of >= n, token ids within the
vocabulary, prompt + max_tokens within the context) are in the descriptions and checked where the request is
turned into a generation (frontend/api/openai_protocol.py) or served; breaking them is a 400 too.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from tinyvllm.frontend.api.request_models import OutOfRange, RequestModel, Reworded
from tinyvllm.frontend.api.tool_calls import MAX_TOOLS
from tinyvllm.protocol.sampling import MAX_LOGPROBS, MAX_N

_BEYOND_MAX_LOGPROBS = f"Requested sample logprobs of {{input}}, which is greater than max allowed: {MAX_LOGPROBS}"
Model = Annotated[str | None, Field(description="The served model name; optional.")]
MaxTokens = Annotated[int | None, Field(ge=1, description="prompt + max_tokens must fit the context"),
                      OutOfRange("max_tokens must be at least 1, got {input}")]
Penalty = Annotated[float, Field(ge=-2, le=2)]
TokenIds = Annotated[list[int], Field(description="token ids, each below the vocabulary size")]
Flag = Annotated[bool, Field(description="default: true")]
TemplateKwargs = Annotated[dict[str, Any] | None, Reworded("'chat_template_kwargs' must be an object")]
# documented cross-field rules (checked in openai_protocol): anything else is a 400
_STREAM_OPTIONS_NEED_STREAM = {"stream_options": {"required": ["stream"], "properties": {"stream": {"const": True}}}}


class StreamOptions(RequestModel):
    include_usage: bool = False


class KVTransferParamsBody(RequestModel):
    """vLLM's kv_transfer_params (disaggregated prefill/decode); unknown keys are accepted and ignored."""
    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_block_ids: Annotated[list[Annotated[int, Field(ge=0)]] | None, Field(max_length=1 << 20)] = None
    remote_engine_id: Annotated[str | None, Field(max_length=256)] = None
    remote_host: Annotated[str | None, Field(max_length=253, pattern=r"^[A-Za-z0-9.:\-\[\]]+$")] = None
    remote_port: Annotated[int | None, Field(ge=0, le=65535)] = None
    remote_request_id: Annotated[str | None, Field(max_length=256)] = None
    tp_size: Annotated[int | None, Field(ge=1, le=256)] = None
    remote_num_tokens: Annotated[int | None, Field(ge=0)] = None


class SamplingFields(RequestModel):
    """What completions and chat share."""
    model_config = ConfigDict(json_schema_extra={"dependentSchemas": _STREAM_OPTIONS_NEED_STREAM})

    model: Model = None
    max_tokens: MaxTokens = None
    temperature: Annotated[float, Field(ge=0)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1, le=2**31 - 1, description="0 or -1: off"),
                     OutOfRange("top_k must be -1 (disable), 0 (disable) or at least 1, got {input}",
                                above="top_k must be at most 2147483647, got {input}")] = 0
    n: Annotated[int, Field(ge=1, le=MAX_N), OutOfRange(f"n must be between 1 and {MAX_N}, got {{input}}")] = 1
    best_of: Annotated[int | None, Field(ge=1, le=MAX_N, description=(
        "at least n (its default): that many samples, the n with the highest cumulative logprob returned; more "
        "than n only without stream"))] = None
    use_beam_search: bool = Field(False, description="beam search of width n (at most 10); not with stream")
    length_penalty: float = Field(1.0, description="beam search: beams rank by cumulative logprob / "
                                                   "length ** length_penalty")
    early_stopping: bool = Field(False, description="accepted and ignored, as vLLM's online beam search does")
    seed: Annotated[int | None, Field(ge=-(2**63), le=2**63 - 1)] = None
    stop: Annotated[str | list[str], Reworded("'stop' must be a string or a list of strings"),
                    Field(default_factory=list)]
    stop_token_ids: Annotated[TokenIds, Reworded("'stop_token_ids' must be a list of integers"),
                              Field(default_factory=list)]
    ignore_eos: bool = False
    skip_special_tokens: Flag = True
    add_special_tokens: bool | None = Field(None, description="default: true for completions, false for chat")
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="Only with stream=true.")
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, Field(gt=0),
                                  OutOfRange("repetition_penalty must be greater than zero, got {input}.")] = 1.0
    min_tokens: Annotated[int, Field(ge=0, description="At most max_tokens (16 for completions).")] = 0
    logit_bias: Annotated[dict[str, Annotated[float, Reworded("{where} must be a finite number")]],
                          Field(default_factory=dict, json_schema_extra={"propertyNames": {"pattern": "^[0-9]+$"}},
                                description="token id (as a string) -> bias added to its logit, clamped to "
                                            "[-100, 100]")]
    include_stop_str_in_output: bool = False
    echo: bool = Field(False, description="completions: the prompt before the output; chat: the last message's "
                                          "content, when it is the assistant's")
    user: str | None = Field(None, description="accepted and ignored")
    # structured output (frontend/api/structured_output.py): one of these per request
    response_format: dict[str, Any] | None = Field(
        None, description='{"type": "text" | "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}')
    structured_outputs: dict[str, Any] | None = Field(
        None, description="vLLM's: one of json (a schema), regex, choice (strings), grammar (Lark or GBNF), "
                          "json_object")
    guided_json: dict[str, Any] | str | None = Field(None, description="a JSON schema the output follows")
    guided_regex: str | None = Field(None, description="a regular expression the output matches")
    guided_choice: list[str] | None = Field(None, min_length=1, description="the output is one of these strings")
    guided_grammar: str | None = Field(None, description="a Lark or GBNF grammar the output follows",
                                       examples=['start: "yes" | "no"'])
    kv_transfer_params: KVTransferParamsBody | None = Field(
        None, description="disaggregated prefill/decode (vLLM's contract): {do_remote_decode: true} to a prefill "
                          "instance; what it answers, to a decode instance")


class CompletionRequest(SamplingFields):
    prompt: Annotated[str | list[int] | list[str] | list[list[int]],
                      Reworded("'prompt' must be a list of integers"),
                      Field(description="a string or token ids; a list of one of those is a batch of one")]
    logprobs: Annotated[int | None, Field(ge=0, le=MAX_LOGPROBS, description="top logprobs per token (also the "
                                                                              "prompt's, with echo)"),
                        OutOfRange("`logprobs` must be a positive value.", above=_BEYOND_MAX_LOGPROBS)] = None


class TextPart(RequestModel):
    type: Literal["text"]
    text: str


class CalledFunction(RequestModel):
    name: str
    arguments: str = Field(description="the arguments as JSON text (an object)")


class MessageToolCall(RequestModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(RequestModel):
    role: str = Field(json_schema_extra={"enum": ["system", "user", "assistant", "tool"]},
                      description="any role the chat template takes")
    content: Annotated[str | list[TextPart] | None, Reworded(
        '{where} must be a string or a list of parts of the form {"type": "text", "text": "..."}')] = None
    tool_calls: list[MessageToolCall] | None = Field(None, description="an assistant message's calls")
    tool_call_id: str | None = Field(None, description="a tool message: the call it answers")
    name: str | None = None


class FunctionTool(RequestModel):
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, description="a JSON schema")
    strict: bool | None = Field(None, description="accepted: the arguments always follow the schema when a call "
                                                  "is forced (tool_choice required or named)")


class Tool(RequestModel):
    type: Literal["function"] = "function"
    function: FunctionTool


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"] = "function"
    function: NamedFunction


Messages = Annotated[list[Annotated[ChatMessage, Reworded("{where} must be an object with a string 'role'")]],
                     Field(min_length=1), Reworded("'messages' must be a non-empty list", when_missing=True)]


class ChatRequest(SamplingFields):
    model_config = ConfigDict(json_schema_extra={"dependentSchemas": {
        **_STREAM_OPTIONS_NEED_STREAM,
        "top_logprobs": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}})

    messages: Messages
    max_completion_tokens: Annotated[MaxTokens, Field(description="wins over max_tokens")] = None
    logprobs: bool = False
    top_logprobs: Annotated[int | None, Field(ge=0, le=MAX_LOGPROBS, description="needs logprobs: true"),
                            OutOfRange("`top_logprobs` must be a positive value.", above=_BEYOND_MAX_LOGPROBS)] = None
    tools: Annotated[list[Tool] | None, Field(max_length=MAX_TOOLS)] = None
    tool_choice: Annotated[Literal["none", "auto", "required"] | NamedToolChoice | None, Reworded(
        """'tool_choice' must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}""")
    ] = Field(None, examples=["auto"], description='default: "auto" with tools, "none" without; "required" and a '
                                                   "named function are enforced by a grammar: the arguments follow "
                                                   "the function's parameters schema")
    parallel_tool_calls: bool = Field(True, description="false: at most one call")
    chat_template_kwargs: TemplateKwargs = Field(
        None, examples=[{"enable_thinking": False}], description="extra variables for the chat template (Qwen3's "
                                                                 "enable_thinking: false turns its thinking off)")
    reasoning_effort: Literal["low", "medium", "high"] | None = Field(
        None, examples=["low"], description="passed to the chat template as reasoning_effort (for models whose template reads it)")
    thinking_token_budget: Annotated[int | None, Field(ge=0, le=2**31 - 1)] = Field(
        None, examples=[256], description="a reasoning model thinks at most this many tokens: then its reply is made "
                                          "to close the thinking and answer (vLLM's name)")


NonEmptyText = Annotated[str, Field(min_length=1)]
InputIds = Annotated[TokenIds, Field(min_length=1)]


class EmbeddingRequest(RequestModel):
    model: Model = None
    input: Annotated[NonEmptyText | InputIds | Annotated[list[NonEmptyText | InputIds], Field(min_length=1)],
                     Reworded("'input' must be a non-empty string, array of strings, array of token ids, or array "
                              "of arrays of token ids", when_missing=True),
                     Field(description="each text or token id list is embedded on its own and must fit the context")]
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32")
    dimensions: int | None = Field(None, description="not supported: the vectors have the model's hidden size, and "
                                                     "any number is a 400")
    user: str | None = Field(None, description="accepted and ignored")


MAX_RERANK_DOCUMENTS = 1000  # Cohere's limit
Text = Annotated[str, Field(max_length=1 << 20)]
Instruction = Annotated[Text | None, Field(description="the reranker's <Instruct> line (default: web search)")]


class RerankDocument(RequestModel):
    text: Annotated[Text, Reworded("a document object must have a 'text' string", when_missing=True)]


class RerankRequest(RequestModel):
    """vLLM's, Jina's and Cohere's rerank body."""
    model: Model = None
    query: Annotated[Text, Reworded("'query' must be a string", when_missing=True)]
    documents: Annotated[list[Text | RerankDocument], Field(min_length=1, max_length=MAX_RERANK_DOCUMENTS),
                         Reworded(f"'documents' must be an array of 1 to {MAX_RERANK_DOCUMENTS} strings or "
                                  f"{{\"text\": ...}} objects", when_missing=True)]
    top_n: Annotated[int, Field(ge=0, description="the best n documents; 0 or absent: all of them")] = 0
    return_documents: Flag = True
    instruction: Instruction = None


class ScoreRequest(RequestModel):
    """vLLM's /score: text_1 against each text_2 (one to many), or pairwise (two lists of one length)."""
    model: Model = None
    text_1: Annotated[Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_RERANK_DOCUMENTS)],
                      Reworded("'text_1' must be a string or a non-empty array of strings", when_missing=True)]
    text_2: Annotated[Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_RERANK_DOCUMENTS)],
                      Reworded("'text_2' must be a string or a non-empty array of strings", when_missing=True)]
    instruction: Instruction = None


class TokenizeCompletionRequest(RequestModel):
    model: Model = None
    prompt: Annotated[str, Reworded("'prompt' (a string) or 'messages' is required", when_missing=True)]
    add_special_tokens: Flag = True
    return_token_strs: bool = False


class TokenizeChatRequest(RequestModel):
    model: Model = None
    messages: Messages
    add_generation_prompt: Flag = True
    add_special_tokens: bool = False
    continue_final_message: Annotated[Literal[False], Reworded("continue_final_message is not supported")] = False
    return_token_strs: bool = False
    chat_template_kwargs: TemplateKwargs = Field(
        None, description="extra variables for the chat template, as on /v1/chat/completions")


class DetokenizeRequest(RequestModel):
    model: Model = None
    tokens: Annotated[TokenIds, Reworded("'tokens' must be a list of integers", when_missing=True)]
