"""The frames of a streamed answer passing through the router, and the error event that ends a broken one.

Chunks from the instance pass on as soon as they hold whole frames (an SSE event ending in a blank line, an NDJSON
line); only a frame cut in two waits for its end. So if the instance fails mid-stream, the error event the router
adds lands on a frame boundary, in the stream's own shape: OpenAI's `data: {"error": {...}}` and `data: [DONE]`, or
Ollama's `{"error": "..."}` line. A stream that already ended (its [DONE], or Ollama's `"done": true` line) is left
as it is.
"""
import json

from tinyvllm.frontend.api.ollama.http_io import NDJSON, ndjson_line
from tinyvllm.frontend.api.openai_protocol import error_body
from tinyvllm.frontend.api.streaming import DONE, sse_event

SSE = "text/event-stream"
_FRAME_END = {SSE: b"\n\n", NDJSON: b"\n"}


def stream_kind(content_type: str) -> str | None:
    """SSE or NDJSON for a streamed answer's content type; None for a whole body."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media if media in _FRAME_END else None


class StreamFraming:
    def __init__(self, kind: str):
        self.kind, self._end = kind, _FRAME_END[kind]
        self._partial = b""
        self._last_frame = b""

    def feed(self, chunk: bytes) -> bytes:
        """The whole frames now complete (b"" if none); a trailing partial frame is kept for the next chunk."""
        data = self._partial + chunk
        cut = data.rfind(self._end)
        if cut < 0:
            self._partial = data
            return b""
        cut += len(self._end)
        self._partial = data[cut:]
        complete = data[:cut]
        last_start = complete.rfind(self._end, 0, len(complete) - len(self._end))
        self._last_frame = complete[last_start + len(self._end) if last_start >= 0 else 0:]
        return complete

    def rest(self) -> bytes:
        """What is left once the stream ended normally (a last frame without its terminator)."""
        rest, self._partial = self._partial, b""
        return rest

    @property
    def ended(self) -> bool:
        """Whether the last whole frame closes the stream."""
        frame = self._last_frame.strip()
        if self.kind == SSE:
            return frame == DONE.strip()
        try:
            last = json.loads(frame) if frame else None
        except ValueError:
            return False
        return isinstance(last, dict) and (last.get("done") is True or "error" in last)

    def error_event(self, message: str, status: int = 502, type_: str = "BadGatewayError") -> bytes:
        """The frames that end the stream with an explicit error (a partial frame held back is dropped)."""
        self._partial = b""
        if self.kind == SSE:
            return sse_event(error_body(message, type_, status)) + DONE
        return ndjson_line({"error": message})
