"""OpenAI request parsing/validation and response/error bodies, shaped as vLLM serves them."""
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tinyvllm.protocol.sampling import MAX_N, SamplingParams


class APIError(Exception):
    """Anything that ends a request with an OpenAI-shaped error body."""

    def __init__(self, message: str, status: int = 400, type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param = message, status, type, param

    def body(self) -> dict:
        return error_body(self.message, self.type, self.status, self.param)


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
    messages: list[dict[str, str]] = field(default_factory=list)  # chat; content already flattened to text
    is_chat: bool = False  # chooses the logprobs format
    include_stop_str_in_output: bool = False
    # Completions: the prompt goes before the output. Chat (vLLM's extension): the last message's content does,
    # when it is the assistant's (the reply continues it).
    echo: bool = False


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "a boolean", list: "an array",
               dict: "an object"}


def _get(body: dict, name: str, types: tuple, default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    # bool is an int subclass, but a JSON true is never a valid number.
    value_ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not value_ok:
        names = " or ".join(_TYPE_NAMES[t] for t in types if not (t is int and float in types))
        raise APIError(f"'{name}' must be {names}, got {value!r:.100}", param=name)
    if float in types and not _is_finite_number(value):
        raise APIError(f"'{name}' must be a finite number", param=name)
    return value


def _is_finite_number(value: Any) -> bool:
    """A JSON number that is finite as a float: a huge integer literal (10**400) is not (float() overflows)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _int_list(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise APIError(f"'{name}' must be a list of integers", param=name)
    return value


def _parse_common(body: Any, is_chat: bool) -> GenerationRequest:
    if not isinstance(body, dict):
        raise APIError("The request body must be a JSON object")
    n = _get(body, "n", (int,), 1)
    if not 1 <= n <= MAX_N:
        raise APIError(f"n must be between 1 and {MAX_N}, got {n}", param="n")
    best_of = _get(body, "best_of", (int,), n)
    if best_of < n:
        raise APIError(f"best_of must be greater than or equal to n, got n={n} and best_of={best_of}",
                       param="best_of")
    if best_of > n:
        raise APIError("best_of > n is not supported yet", param="best_of")
    logprobs = _parse_logprobs(body, is_chat)
    echo = _get(body, "echo", (bool,), False)
    min_tokens = _get(body, "min_tokens", (int,), 0)

    max_tokens = _get(body, "max_tokens", (int,))
    if is_chat:
        max_tokens = _get(body, "max_completion_tokens", (int,), max_tokens)
    elif max_tokens is None:
        max_tokens = 16
    if max_tokens is not None and max_tokens < 1:
        raise APIError(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")

    stop = _get(body, "stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) for s in stop):
        raise APIError("'stop' must be a string or a list of strings", param="stop")
    stop_token_ids = body.get("stop_token_ids")
    stop_token_ids = [] if stop_token_ids is None else _int_list(stop_token_ids, "stop_token_ids")

    stream = _get(body, "stream", (bool,), False)
    stream_options = _get(body, "stream_options", (dict,))
    if stream_options is not None and not stream:
        raise APIError("Stream options can only be defined when `stream=True`.", param="stream_options")
    include_usage = bool(_get(stream_options or {}, "include_usage", (bool,), False))

    sampling = SamplingParams(
        temperature=float(_get(body, "temperature", (int, float), 1.0)),
        top_p=float(_get(body, "top_p", (int, float), 1.0)),
        top_k=_get(body, "top_k", (int,), 0),
        # chat's "rest of the context" is filled in (and checked against min_tokens) once the prompt length is known
        max_tokens=max_tokens or max(1, min_tokens),
        seed=_get(body, "seed", (int,)),
        stop_token_ids=list(stop_token_ids),
        ignore_eos=_get(body, "ignore_eos", (bool,), False),
        n=n,
        min_p=float(_get(body, "min_p", (int, float), 0.0)),
        presence_penalty=float(_get(body, "presence_penalty", (int, float), 0.0)),
        frequency_penalty=float(_get(body, "frequency_penalty", (int, float), 0.0)),
        repetition_penalty=float(_get(body, "repetition_penalty", (int, float), 1.0)),
        min_tokens=min_tokens,
        logprobs=logprobs,
        prompt_logprobs=logprobs if echo and not is_chat else None,
    )
    sampling.set_logit_bias(_parse_logit_bias(body))
    try:
        sampling.validate()
    except ValueError as e:
        raise APIError(str(e)) from None
    return GenerationRequest(
        model=_get(body, "model", (str,)), sampling=sampling, max_tokens=max_tokens,
        stop=[s for s in stop if s], stream=stream, include_usage=include_usage,
        skip_special_tokens=_get(body, "skip_special_tokens", (bool,), True),
        add_special_tokens=_get(body, "add_special_tokens", (bool,), not is_chat), is_chat=is_chat,
        include_stop_str_in_output=_get(body, "include_stop_str_in_output", (bool,), False), echo=echo)


def _parse_logprobs(body: dict, is_chat: bool) -> int | None:
    """How many top logprobs per output token, or None for no logprobs (vLLM's checks and wording)."""
    if not is_chat:
        logprobs = _get(body, "logprobs", (int,))
        if logprobs is not None and logprobs < 0:
            raise APIError("`logprobs` must be a positive value.", param="logprobs")
        return logprobs
    wanted = _get(body, "logprobs", (bool,), False)
    top = _get(body, "top_logprobs", (int,))
    if top is not None and top < 0:
        raise APIError("`top_logprobs` must be a positive value.", param="top_logprobs")
    if top and not wanted:
        raise APIError("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
    return (top or 0) if wanted else None


def _parse_logit_bias(body: dict) -> dict[int, float]:
    """{"token id": bias} -> {token id: bias}; values are clamped to [-100, 100] by SamplingParams."""
    raw = _get(body, "logit_bias", (dict,), {})
    bias = {}
    for key, value in raw.items():
        try:
            token_id = int(key)
        except ValueError:
            raise APIError(f"Found token_id `{key}` in logit_bias but token_id must be an integer or string "
                           f"representation of an integer.", param="logit_bias") from None
        if not _is_finite_number(value):
            raise APIError(f"logit_bias[{key!r}] must be a finite number, got {value!r:.50}", param="logit_bias")
        bias[token_id] = float(value)
    return bias


def parse_completion_request(body: Any) -> GenerationRequest:
    req = _parse_common(body, is_chat=False)
    prompt = body.get("prompt")
    if prompt is None:
        raise APIError("'prompt' is required", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise APIError("Multiple prompts in one request are not supported yet", param="prompt")
    if not isinstance(prompt, str):
        prompt = _int_list(prompt, "prompt")
        if not prompt:
            raise APIError("'prompt' must not be empty", param="prompt")
    req.prompt = prompt
    return req


def _message_text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(f"messages[{index}].content: only parts of the form "
                               '{"type": "text", "text": "..."} are supported', param="messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise APIError(f"messages[{index}].content must be a string or a list of content parts", param="messages")


def parse_chat_request(body: Any) -> GenerationRequest:
    req = _parse_common(body, is_chat=True)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list", param="messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise APIError(f"messages[{i}] must be an object with a string 'role'", param="messages")
        req.messages.append({"role": msg["role"], "content": _message_text(msg.get("content"), i)})
    return req


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


def chat_choice(index: int, text: str, finish_reason: str | None, stop_reason: str | int | None,
                logprobs: dict | None = None) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish_reason, "stop_reason": stop_reason}


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
