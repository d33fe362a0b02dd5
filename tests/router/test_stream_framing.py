"""Streams pass through frame by frame (a frame cut across chunks waits for its end), and a broken stream ends with
an explicit error in its own shape, on a frame boundary."""
import json

from tinyvllm.frontend.api.ollama.http_io import NDJSON
from tinyvllm.frontend.router.stream_framing import SSE, StreamFraming, stream_kind


def test_stream_kinds():
    assert stream_kind("text/event-stream; charset=utf-8") == SSE
    assert stream_kind("application/x-ndjson") == NDJSON
    assert stream_kind("application/json") is None


def test_whole_sse_events_pass_at_once_and_a_cut_one_waits_for_its_end():
    framing = StreamFraming(SSE)
    assert framing.feed(b'data: {"a":1}\n\n') == b'data: {"a":1}\n\n'
    assert framing.feed(b'data: {"b":') == b""
    assert framing.feed(b'2}\n\ndata: {"c"') == b'data: {"b":2}\n\n'
    assert not framing.ended
    error = framing.error_event("the instance failed")
    assert error.endswith(b"data: [DONE]\n\n")
    event = json.loads(error.split(b"\n\n")[0][len(b"data: "):])
    assert event["error"]["message"] == "the instance failed" and event["error"]["code"] == 502


def test_a_stream_that_reached_its_done_has_ended():
    framing = StreamFraming(SSE)
    framing.feed(b'data: {"a":1}\n\ndata: [DONE]\n\n')
    assert framing.ended and framing.rest() == b""


def test_ndjson_lines_and_ollamas_last_line():
    framing = StreamFraming(NDJSON)
    assert framing.feed(b'{"response":"a","done":false}\n{"resp') == b'{"response":"a","done":false}\n'
    assert not framing.ended
    assert framing.error_event("gone") == b'{"error": "gone"}\n'
    framing = StreamFraming(NDJSON)
    framing.feed(b'{"response":"a","done":false}\n{"done":true}\n')
    assert framing.ended


def test_a_last_frame_without_its_terminator_passes_when_the_stream_ends():
    framing = StreamFraming(NDJSON)
    assert framing.feed(b'{"done":true}') == b""
    assert framing.rest() == b'{"done":true}'
