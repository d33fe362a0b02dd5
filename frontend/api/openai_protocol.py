"""OpenAI request parsing/validation and response/error bodies, shaped as vLLM serves them."""
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tinyvllm.frontend.api.openai_requests import ChatMessage, ChatRequest, CompletionRequest
from tinyvllm.frontend.api.request_models import RequestInvalid, RequestModel, validate
from tinyvllm.frontend.api.structured_output import GrammarInvalid, openai_grammar
from tinyvllm.frontend.api.tool_calls import NO_TOOLS, ChatTools, chat_tools, message_dict
from tinyvllm.frontend.engine.request_errors import EngineRequestError
from tinyvllm.protocol.sampling import MAX_BEAM_WIDTH, BeamSearchParams, KVTransferParams, SamplingParams


class APIError(Exception):
    """Anything that ends a request with an OpenAI-shaped error body."""

    def __init__(self, message: str, status: int = 400, type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param = message, status, type, param

    def body(self) -> dict:
        return error_body(self.message, self.type, self.status, self.param)


def api_error_of(exc: EngineRequestError) -> APIError:
    """How an engine's error reaches an OpenAI client."""
    return APIError(exc.client_message, exc.status, exc.error_type)


def error_body(message: str, type: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def model_not_found(name: str) -> APIError:
    return APIError(f"The model `{name}` does not exist.", 404, "NotFoundError", "model")


@dataclass(slots=True)
class GenerationRequest:
    """What both endpoints share once parsed. max_tokens None means 'fill the context' (chat only).

    Logprobs are asked for through sampling.logprobs (top-k per token) and, for completions with echo,
    sampling.prompt_logprobs."""
    model: str | None
    sampling: SamplingParams
    max_tokens: int | None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    skip_special_tokens: bool = True
    add_special_tokens: bool = True
    prompt: str | list[int] = ""  # completions
    messages: list[dict] = field(default_factory=list)  # chat: role, content (flattened to text), any tool fields
    tools: ChatTools = NO_TOOLS  # chat: its tools, the grammar forcing calls, whether calls are parsed
    is_chat: bool = False  # chooses the logprobs format
    include_stop_str_in_output: bool = False
    # Completions: the prompt goes before the output. Chat (vLLM's extension): the last message's content does,
    # when it is the assistant's (the reply continues it).
    echo: bool = False
    best_of_keep: int | None = None  # best_of > n: sampling.n (= best_of) candidates, this many (n) returned
    logprobs_only_to_rank: bool = False  # sampling.logprobs was set for best_of's ranking, not asked for
    # use_beam_search: the frontend searches (frontend/engine/beam_search.py)
    beam_search: BeamSearchParams | None = None
    template_kwargs: dict = field(default_factory=dict)  # chat: chat_template_kwargs and reasoning_effort
    reasoning_opened: bool = False  # chat: the rendered prompt left a think block open (frontend/api/reasoning.py)
    thinking_budget: int | None = None  # chat: thinking_token_budget


def validated(model: type[RequestModel], body: Any) -> Any:
    """`body` as the request model, or an APIError (400) in this server's words."""
    try:
        return validate(model, body)
    except RequestInvalid as e:
        raise APIError(e.message, param=e.param) from None


def _generation(req: CompletionRequest | ChatRequest, is_chat: bool, tools: ChatTools = NO_TOOLS) -> GenerationRequest:
    """The checks that span fields (vLLM's wording), then the request as SamplingParams and the rest."""
    n, best_of = req.n, req.best_of if req.best_of is not None else req.n
    if best_of < n:
        raise APIError(f"best_of must be greater than or equal to n, got n={n} and best_of={best_of}",
                       param="best_of")
    if best_of > n and req.stream:
        raise APIError("best_of > n is not supported with stream=true", param="best_of")
    if req.use_beam_search and req.stream:
        raise APIError("Streaming is not supported with beam search", param="stream")
    if req.use_beam_search and best_of > n:
        raise APIError("best_of > n is not supported with beam search: n is the beam width", param="best_of")
    if req.use_beam_search and n > MAX_BEAM_WIDTH:
        raise APIError(f"Beam search width (n) must be at most {MAX_BEAM_WIDTH}, got {n}", param="n")
    logprobs = _chat_logprobs(req) if is_chat else req.logprobs
    rank_by_logprobs = best_of > n and logprobs is None
    max_tokens = req.max_tokens
    if is_chat:
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else max_tokens
    elif max_tokens is None:
        max_tokens = 16
    if req.stream_options is not None and not req.stream:
        raise APIError("Stream options can only be defined when `stream=True`.", param="stream_options")
    echo = req.echo
    sampling = SamplingParams(
        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
        # chat's "rest of the context" is filled in (and checked against min_tokens) once the prompt length is known
        max_tokens=max_tokens or max(1, req.min_tokens), seed=req.seed, stop_token_ids=list(req.stop_token_ids),
        ignore_eos=req.ignore_eos, n=best_of, min_p=req.min_p, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, repetition_penalty=req.repetition_penalty,
        min_tokens=req.min_tokens, logprobs=0 if rank_by_logprobs else logprobs,
        prompt_logprobs=logprobs if echo and not is_chat else None)
    sampling.set_logit_bias(_logit_bias(req.logit_bias))
    try:
        sampling.grammar = openai_grammar(req.response_format, req.structured_outputs, {
            "json": req.guided_json, "regex": req.guided_regex, "choice": req.guided_choice,
            "grammar": req.guided_grammar})
    except GrammarInvalid as e:
        raise APIError(e.message, param=e.param) from None
    if tools.grammar is not None:
        if sampling.grammar is not None:
            raise APIError("tool_choice 'required' or a named function cannot be combined with structured output",
                           param="tool_choice")
        sampling.grammar = tools.grammar
    if sampling.grammar is not None and (req.min_tokens or req.ignore_eos):
        # a complete grammar allows only EOS, which min_tokens and ignore_eos forbid: the row would have no token
        raise APIError("min_tokens and ignore_eos are not supported with structured output",
                       param="min_tokens" if req.min_tokens else "ignore_eos")
    if sampling.grammar is not None and req.use_beam_search:
        # each beam step is a request of its own, so no matcher would follow a beam's tokens
        raise APIError("use_beam_search is not supported with structured output", param="use_beam_search")
    if (kv := req.kv_transfer_params) is not None and (kv.do_remote_decode or kv.do_remote_prefill):
        sampling.kv_transfer = KVTransferParams(
            kv.do_remote_decode, kv.do_remote_prefill, list(kv.remote_block_ids or []), kv.remote_engine_id or "",
            kv.remote_host or "", kv.remote_port or 0, kv.remote_request_id or "", kv.tp_size or 1,
            kv.remote_num_tokens or 0)
    try:
        sampling.validate()
    except ValueError as e:
        raise APIError(str(e)) from None
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    add_special_tokens = req.add_special_tokens if req.add_special_tokens is not None else not is_chat
    return GenerationRequest(
        model=req.model, sampling=sampling, max_tokens=max_tokens, stop=[s for s in stop if s], stream=req.stream,
        include_usage=req.stream_options is not None and req.stream_options.include_usage,
        skip_special_tokens=req.skip_special_tokens, add_special_tokens=add_special_tokens, is_chat=is_chat,
        include_stop_str_in_output=req.include_stop_str_in_output, echo=echo,
        best_of_keep=n if best_of > n else None, logprobs_only_to_rank=rank_by_logprobs,
        beam_search=BeamSearchParams(n, sampling.max_tokens, req.ignore_eos, req.length_penalty)
        if req.use_beam_search else None, tools=tools)


def _chat_logprobs(req: ChatRequest) -> int | None:
    """How many top logprobs per output token, or None for no logprobs."""
    if req.top_logprobs and not req.logprobs:
        raise APIError("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None


def _logit_bias(raw: dict[str, float]) -> dict[int, float]:
    """{"token id": bias} -> {token id: bias}; values are clamped to [-100, 100] by SamplingParams."""
    bias = {}
    for key, value in raw.items():
        try:
            bias[int(key)] = value
        except ValueError:
            raise APIError(f"Found token_id `{key}` in logit_bias but token_id must be an integer or string "
                           f"representation of an integer.", param="logit_bias") from None
    return bias


def parse_completion_request(body: Any) -> GenerationRequest:
    parsed = validated(CompletionRequest, body)
    req, prompt = _generation(parsed, is_chat=False), parsed.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        raise APIError("Multiple prompts in one request are not supported yet", param="prompt")
    if isinstance(prompt, list) and not prompt:
        raise APIError("'prompt' must not be empty", param="prompt")
    req.prompt = prompt
    return req


def message_dicts(messages: list[ChatMessage]) -> list[dict]:
    """[{"role", "content"}] with each message's text parts joined by newlines, and its tool fields: calls with
    their arguments as objects, as chat templates take them."""
    return [message_dict(m.role, _text(m.content), [
        {"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": _arguments(c.function.arguments, f"messages[{i}].tool_calls")}}
        for c in m.tool_calls or []], tool_call_id=m.tool_call_id, name=m.name) for i, m in enumerate(messages)]


def _arguments(text: str, param: str) -> dict:
    try:
        arguments = json.loads(text)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise APIError(f"{param}: a call's arguments must be a JSON object, got {text[:100]!r}", param=param)
    return arguments


def _text(content: str | list | None) -> str:
    return "\n".join(part.text for part in content) if isinstance(content, list) else content or ""


def parse_chat_request(body: Any) -> GenerationRequest:
    parsed = validated(ChatRequest, body)
    try:
        tools = chat_tools([t.model_dump() for t in parsed.tools] if parsed.tools else None,
                           parsed.tool_choice.model_dump() if isinstance(parsed.tool_choice, RequestModel)
                           else parsed.tool_choice, parsed.parallel_tool_calls)
    except GrammarInvalid as e:
        raise APIError(e.message, param=e.param) from None
    req = _generation(parsed, is_chat=True, tools=tools)
    req.messages = message_dicts(parsed.messages)
    req.template_kwargs = template_kwargs(parsed.chat_template_kwargs or {}, parsed.reasoning_effort)
    req.thinking_budget = parsed.thinking_token_budget
    if req.thinking_budget is not None and req.beam_search is not None:
        # each beam step is a request of its own, so no worker would follow a beam's thinking
        raise APIError("thinking_token_budget is not supported with use_beam_search", param="thinking_token_budget")
    return req


# the variables the server itself gives a chat template
RESERVED_TEMPLATE_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")


def template_kwargs(extra: dict, reasoning_effort: str | None) -> dict:
    if reserved := sorted(set(extra) & set(RESERVED_TEMPLATE_VARIABLES)):
        raise APIError(f"chat_template_kwargs may not set {', '.join(reserved)}: the server sets them",
                       param="chat_template_kwargs")
    return {**extra, **({"reasoning_effort": reasoning_effort} if reasoning_effort else {})}


# ---- response bodies --------------------------------------------------------

def new_request_id(is_chat: bool) -> str:
    return ("chatcmpl-" if is_chat else "cmpl-") + uuid.uuid4().hex


def usage_body(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _envelope(request_id: str, object_type: str, model: str, created: int | None) -> dict:
    return {"id": request_id, "object": object_type, "created": created or int(time.time()), "model": model}


def completion_choice(index: int, text: str, finish_reason: str | None, stop_reason: str | int | None,
                      logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def chat_choice(index: int, text: str | None, finish_reason: str | None, stop_reason: str | int | None,
                logprobs: dict | None = None, tool_calls: list[dict] | None = None, reasoning: str | None = None) -> dict:
    message = {"role": "assistant", "content": text, **reasoning_fields(reasoning),
               **({"tool_calls": tool_calls} if tool_calls else {})}
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def reasoning_fields(reasoning: str | None) -> dict:
    """A reply's (or a delta's) thinking under both names clients read: reasoning_content (DeepSeek's, most clients)
    and reasoning (vLLM's since 0.11.2); none where there is none."""
    return {"reasoning_content": reasoning, "reasoning": reasoning} if reasoning is not None else {}


def completion_body(request_id: str, model: str, choices: list[dict], usage: dict, created: int | None = None) -> dict:
    return {**_envelope(request_id, "text_completion", model, created), "choices": choices, "usage": usage}


def chat_body(request_id: str, model: str, choices: list[dict], usage: dict, created: int | None = None) -> dict:
    return {**_envelope(request_id, "chat.completion", model, created), "choices": choices, "usage": usage}


def completion_chunk(request_id: str, model: str, created: int, text: str, finish_reason: str | None = None,
                     stop_reason: str | int | None = None, index: int = 0, logprobs: dict | None = None) -> dict:
    choice = completion_choice(index, text, finish_reason, stop_reason, logprobs)
    return {**_envelope(request_id, "text_completion", model, created), "choices": [choice]}


def chat_chunk(request_id: str, model: str, created: int, delta: dict, finish_reason: str | None = None,
               stop_reason: str | int | None = None, index: int = 0, logprobs: dict | None = None) -> dict:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason
    return {**_envelope(request_id, "chat.completion.chunk", model, created), "choices": [choice]}


def usage_chunk(request_id: str, object_type: str, model: str, created: int, usage: dict) -> dict:
    return {**_envelope(request_id, object_type, model, created), "choices": [], "usage": usage}
