"""What a client sees when the engine ends its request with an error: one HTTP status and OpenAI error type per
ErrorKind (protocol/messages.py), used by the OpenAI routes, their streams and the Ollama routes alike
(frontend/api/openai_protocol.py api_error_of)."""
from tinyvllm.protocol.messages import ErrorKind, RequestOutput

# kind -> (status, OpenAI error type, what goes before the engine's message)
_STATUS = {
    ErrorKind.INVALID_REQUEST: (400, "BadRequestError", ""),
    ErrorKind.ENGINE_FAILURE: (500, "InternalServerError", "Internal server error: "),
    ErrorKind.UNAVAILABLE: (503, "ServiceUnavailableError", "The engine is not available: "),
    ErrorKind.TIMEOUT: (504, "TimeoutError", ""),
}


class EngineRequestError(Exception):
    """The engine ended this request with finish_reason 'error'; kind says whose fault it was."""

    def __init__(self, message: str, kind: str | None = ErrorKind.ENGINE_FAILURE):
        super().__init__(message)
        self.kind = kind if kind in _STATUS else ErrorKind.ENGINE_FAILURE

    @classmethod
    def from_output(cls, out: RequestOutput, default: str = "the engine could not serve this request"):
        return cls(out.error or default, out.error_kind)

    @property
    def status(self) -> int:
        return _STATUS[self.kind][0]

    @property
    def error_type(self) -> str:
        return _STATUS[self.kind][1]

    @property
    def client_message(self) -> str:
        return f"{_STATUS[self.kind][2]}{self}"
