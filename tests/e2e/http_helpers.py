"""Small HTTP helpers shared by the e2e tests: SSE streams read with httpx, OpenAI error bodies."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

import httpx

from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S


@dataclass
class StreamResult:
    status: int
    events: list = field(default_factory=list)  # decoded data payloads, "[DONE]" kept as a string
    text: str = ""
    finish_reason: str | None = None
    hung_up: bool = False  # the client went away (stream's `stop`) before the stream ended

    @property
    def errors(self) -> list[dict]:
        return [e for e in self.events if isinstance(e, dict) and "error" in e]

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"


def chunk_text(event: dict, is_chat: bool) -> str:
    if not event.get("choices"):
        return ""
    choice = event["choices"][0]
    return (choice.get("delta", {}).get("content") or "") if is_chat else (choice.get("text") or "")


def stream(url: str, path: str, body: dict, timeout: float = REQUEST_TIMEOUT_S,
           result: StreamResult | None = None, stop: threading.Event | None = None) -> StreamResult:
    """POSTs a streamed request and reads the whole SSE body, checking vLLM's framing (`data: ...` + blank line);
    `result`, when given, is filled as the events arrive (another thread may watch it); once `stop` is set, the
    client hangs up after the next event, as a client that goes away."""
    is_chat = path.endswith("chat/completions")
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=timeout) as r:
        result = result or StreamResult(r.status_code)
        result.status = r.status_code
        if r.status_code != 200:
            r.read()
            result.events.append(r.json())
            return result
        assert r.headers["content-type"].startswith("text/event-stream"), r.headers
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            data = line[len("data: "):]
            event = data if data == "[DONE]" else json.loads(data)
            result.events.append(event)
            if isinstance(event, dict) and "choices" in event:
                result.text += chunk_text(event, is_chat)
                if event["choices"] and event["choices"][0].get("finish_reason"):
                    result.finish_reason = event["choices"][0]["finish_reason"]
            if stop is not None and stop.is_set() and event != "[DONE]":
                result.hung_up = True
                break
    return result


def complete(url: str, path: str, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> tuple[str, str]:
    """A non-streamed request that must succeed: (text, finish_reason)."""
    r = httpx.post(url + path, json=body, timeout=timeout)
    assert r.status_code == 200, (r.status_code, r.text)
    choice = r.json()["choices"][0]
    return (choice["message"]["content"] if path.endswith("chat/completions") else choice["text"]), choice["finish_reason"]


def assert_openai_error(response: httpx.Response, status: int, param: str | None = "any") -> dict:
    """The OpenAI error shape: {"error": {"message", "type", "param", "code"}} with code == the HTTP status."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err), err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["code"] == status, err
    if param != "any":
        assert err["param"] == param, err
    return err


def chat_body(content: str, **extra) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": content}], **extra}


def completion_body(prompt: str, **extra) -> dict:
    return {"model": MODEL_NAME, "prompt": prompt, **extra}
