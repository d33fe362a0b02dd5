"""The client side of `tinyvllm run/ps/list/show/create`: where the server is, and its Ollama /api routes over httpx.

Every failure becomes a CliError with a one-line message, so the verbs print `Error: ...` and exit 1, never a
traceback.
"""
from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx

from tinyvllm.frontend.api.auth import API_KEY_ENV

HOST_ENV = "TINYVLLM_HOST"
DEFAULT_PORT = 8000
DEFAULT_HOST = f"http://127.0.0.1:{DEFAULT_PORT}"
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "::")


class CliError(Exception):
    """A failure to report in one line."""


class ServerDown(CliError):
    pass


class NotFound(CliError):
    pass


def resolve_host(flag: str | None, environ) -> str:
    """--host, else $TINYVLLM_HOST, else http://127.0.0.1:8000, as a base URL. Accepts what OLLAMA_HOST accepts:
    'http://host:port', 'host:port', 'host', ':port', '[::1]:port', 'https://host' (port 443)."""
    text = (flag if flag is not None else environ.get(HOST_ENV, "")).strip()
    if not text:
        return DEFAULT_HOST
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "http", text
    scheme = scheme.lower()
    if scheme not in ("http", "https"):
        raise CliError(f"invalid host {text!r}: the scheme must be http or https")
    default_port = DEFAULT_PORT if not sep else {"http": 80, "https": 443}[scheme]
    hostport, _, path = rest.partition("/")
    try:
        parts = urlsplit(f"//{hostport}")
        host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    except ValueError as e:
        raise CliError(f"invalid host {text!r}: {e}") from None
    if ":" in host:  # IPv6 literal
        host = f"[{ipaddress.ip_address(host)}]"
    base = f"{scheme}://{host}:{port}"
    return f"{base}/{path.strip('/')}" if path.strip("/") else base


def is_local(base_url: str) -> bool:
    return (urlsplit(base_url).hostname or "") in LOCAL_NAMES


def error_text(response: httpx.Response) -> str:
    """The server's {"error": ...} message, else the status line."""
    try:
        message = response.json().get("error")
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else f"{response.status_code} {response.reason_phrase}".strip()


class OllamaApi:
    """The server's Ollama routes. transport: for tests (an httpx.MockTransport)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0,
                 transport: httpx.BaseTransport | None = None):
        self.base_url = base_url
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=base_url, headers=headers, transport=transport,
                                    timeout=httpx.Timeout(timeout_s, connect=5.0))

    def close(self) -> None:
        self._client.close()

    def answers(self) -> bool:
        """True when something answers /api/version at the host."""
        try:
            self.get("/api/version")
            return True
        except ServerDown:
            return False

    def get(self, path: str) -> dict:
        return self._json(self._send("GET", path))

    def post(self, path: str, body: dict) -> dict:
        return self._json(self._send("POST", path, body))

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        """The NDJSON objects of a streamed reply; an {"error": ...} line raises CliError."""
        try:
            with self._client.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    self._raise_for(response)
                for line in response.iter_lines():
                    if not line.strip():
                        continue
                    chunk = json.loads(line)
                    if "error" in chunk:
                        raise CliError(str(chunk["error"]))
                    yield chunk
        except httpx.HTTPError as e:
            raise self._translate(e) from None
        except json.JSONDecodeError:
            raise CliError(f"the server at {self.base_url} sent a line that is not JSON") from None

    def _send(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise self._translate(e) from None
        if response.status_code >= 400:
            self._raise_for(response)
        return response

    def _raise_for(self, response: httpx.Response):
        message = error_text(response)
        if response.status_code == 401:
            raise CliError(f"{message} (set {API_KEY_ENV} to the server's API key)")
        raise (NotFound if response.status_code == 404 else CliError)(message)

    def _json(self, response: httpx.Response) -> dict:
        try:
            return response.json() if response.content else {}
        except ValueError:
            raise CliError(f"the server at {self.base_url} did not answer JSON on {response.request.url.path}; "
                           "is it a tinyvllm (or Ollama) server?") from None

    def _translate(self, e: httpx.HTTPError) -> CliError:
        if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
            return ServerDown(f"could not connect to a tinyvllm server at {self.base_url}: is `tinyvllm serve` "
                              f"running? (set --host or {HOST_ENV})")
        if isinstance(e, httpx.TimeoutException):
            return CliError(f"the server at {self.base_url} did not answer in time")
        return CliError(f"talking to {self.base_url}: {e or type(e).__name__}")
