"""`--api-key`: every /v1, /v2 and /api route, /rerank, /score and /kv_events need `Authorization: Bearer <key>`
(Anthropic's /v1/messages also takes `x-api-key: <key>`); /health, /metrics and the rest stay open.

A pure ASGI middleware: Starlette's BaseHTTPMiddleware would wrap every response in its own stream, which breaks
server-sent events and hides client disconnects from the handlers.
"""
import hashlib
import hmac
import json

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from tinyvllm.frontend.api.anthropic.errors import anthropic_error_body, is_anthropic_path
from tinyvllm.frontend.api.openai_protocol import error_body

API_KEY_ENV = "TINYVLLM_API_KEY"
PROTECTED_PREFIXES = ("/v1", "/v2", "/api", "/rerank", "/score", "/kv_events")
OPENAI, OLLAMA, ANTHROPIC = "openai", "ollama", "anthropic"



def resolve_api_key(flag: str | None, environ) -> str | None:
    """--api-key wins over $TINYVLLM_API_KEY; an empty flag is a mistake, an empty variable means no key."""
    if flag is not None:
        if not flag:
            raise ValueError("--api-key must not be empty")
        return flag
    return environ.get(API_KEY_ENV) or None




def is_protected(path: str, prefixes: tuple[str, ...] = PROTECTED_PREFIXES) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def error_style(path: str) -> str:
    if path == "/api" or path.startswith("/api/"):
        return OLLAMA
    return ANTHROPIC if is_anthropic_path(path) else OPENAI


def error_body_for(path: str, message: str, status: int, type_: str) -> dict:
    """An error in the shape of the API `path` belongs to: Ollama's {"error": message}, Anthropic's, or OpenAI's
    (type_ is OpenAI's error type)."""
    style = error_style(path)
    if style == OLLAMA:
        return {"error": message}
    return anthropic_error_body(message, status) if style == ANTHROPIC else error_body(message, type_, status)


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


class KeyCheck:
    """Compares candidates with a key through fixed-length digests: the time taken says nothing about the key."""

    def __init__(self, key: str):
        self._key_digest = _digest(key.encode("utf-8"))

    def matches(self, candidate: bytes) -> bool:
        return hmac.compare_digest(_digest(candidate), self._key_digest)

    def bearer_matches(self, headers: Headers) -> bool:
        """Whether `Authorization: Bearer <key>` carries the key. compare_digest runs whatever the scheme, so a wrong
        scheme takes as long as a wrong key."""
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        # Starlette decodes header bytes as latin-1: encoding back gives the bytes sent, so a UTF-8 key matches.
        key_matches = self.matches(credentials.strip().encode("latin-1"))
        return scheme.lower() == "bearer" and key_matches


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, prefixes: tuple[str, ...] = PROTECTED_PREFIXES):
        """prefixes: the paths that need the key (`tinyvllm router` guards /instances with its register secret)."""
        if not api_key:
            raise ValueError("the API key must not be empty")
        self.app, self.prefixes = app, prefixes
        self.key = KeyCheck(api_key)

    def authorized(self, headers: Headers, path: str) -> bool:
        """`Authorization: Bearer <key>`; on Anthropic's routes `x-api-key: <key>` too (its clients send that)."""
        bearer = self.key.bearer_matches(headers)
        x_api_key = self.key.matches(headers.get("x-api-key", "").encode("latin-1"))  # (both compared: same time)
        return bearer or (x_api_key and "x-api-key" in headers and error_style(path) == ANTHROPIC)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # CORS preflights never carry credentials, so OPTIONS passes (as in vLLM); lifespan events too.
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or not is_protected(scope["path"], self.prefixes):
            await self.app(scope, receive, send)
            return
        if self.authorized(Headers(scope=scope), scope["path"]):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        message = "unauthorized" if error_style(path) == OLLAMA else "Unauthorized"
        body = json.dumps(error_body_for(path, message, 401, "AuthenticationError")).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
