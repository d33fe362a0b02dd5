"""One streamed request to an OpenAI-compatible server, timed: TTFT, the gaps between content chunks, E2E.

Works against tinyvllm, vLLM and llama.cpp's llama-server: /v1/completions (`choices[0].text`) or
/v1/chat/completions (`choices[0].delta.content`, or `reasoning_content` while a reasoning model thinks).
A request that fails (an HTTP error, an error event in the stream, a dropped connection, no content at all)
comes back with success=False and the error; it never raises.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by whoever makes the client; `tinyvllm --help` stays light
    import httpx


@dataclass(slots=True)
class Target:
    """Where and how to send: the endpoint's full URL, the model name, and the request's fixed fields."""
    url: str
    model: str
    chat: bool = False  # /v1/chat/completions (messages) instead of /v1/completions (prompt)
    ignore_eos: bool = False
    headers: dict = field(default_factory=dict)

    def body(self, prompt: str, max_tokens: int) -> dict:
        # skip_special_tokens off: a token that is one (a synthetic twin's greedy choice, say) still streams text, so
        # it is timed (the client counts tokens by the chunks that carry some); servers without the field ignore it
        body = {"model": self.model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}, "skip_special_tokens": False}
        if self.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


@dataclass(slots=True)
class RequestResult:
    prompt_len: int  # input tokens: the server's usage.prompt_tokens when it sent usage, else the prompt's own count
    success: bool = False
    error: str = ""
    ttft: float = 0.0  # seconds from sending to the first chunk with content
    itl: list[float] = field(default_factory=list)  # seconds between consecutive chunks with content
    latency: float = 0.0  # seconds from sending to the end of the stream
    output_tokens: int = 0  # usage.completion_tokens when sent, else the number of chunks with content
    start: float = 0.0  # time.perf_counter() when sent

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first; None for a single-token output."""
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def chunk_content(chunk: dict, chat: bool) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    if not chat:
        return choices[0].get("text") or ""
    delta = choices[0].get("delta") or {}
    return delta.get("content") or delta.get("reasoning_content") or ""


async def send_request(client: httpx.AsyncClient, target: Target, prompt: str, prompt_len: int,
                       max_tokens: int) -> RequestResult:
    result = RequestResult(prompt_len)
    result.start = last = time.perf_counter()
    chunks, usage = 0, None
    try:
        async with client.stream("POST", target.url, json=target.body(prompt, max_tokens),
                                 headers=target.headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                result.error = f"HTTP {resp.status_code}: {text[:300]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    result.error = f"error event: {json.dumps(chunk['error'])[:300]}"
                    return result
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if chunk_content(chunk, target.chat):
                    now = time.perf_counter()
                    if chunks == 0:
                        result.ttft = now - result.start
                    else:
                        result.itl.append(now - last)
                    chunks, last = chunks + 1, now
    except Exception as e:  # httpx errors, a broken event, a dropped connection: this request failed, the run goes on
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.latency = time.perf_counter() - result.start
    if chunks == 0:
        result.error = "the stream ended without any content"
        return result
    result.output_tokens = int(usage.get("completion_tokens") or chunks) if usage else chunks
    if usage and usage.get("prompt_tokens"):
        result.prompt_len = int(usage["prompt_tokens"])
    result.success = True
    return result
