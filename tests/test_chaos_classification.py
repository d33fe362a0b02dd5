"""benchmarks/chaos.py: how one request's answer is read and classified (the benchmark's pass/fail rests on it)."""
import importlib.util
import json
import pathlib

import pytest

_spec = importlib.util.spec_from_file_location("chaos", pathlib.Path(__file__).parents[1] / "benchmarks" / "chaos.py")
chaos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chaos)
Outcome, classify, read_answer = chaos.Outcome, chaos.classify, chaos.read_answer

SSE, NDJSON, JSON = "text/event-stream; charset=utf-8", "application/x-ndjson", "application/json"


def sse(*events) -> str:
    return "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)


def ndjson(*objects) -> str:
    return "".join(json.dumps(o) + "\n" for o in objects)


CHUNK = {"choices": [{"index": 0, "text": "hi", "finish_reason": None}]}


@pytest.mark.parametrize("text, content_type, expected", [
    (sse(CHUNK, "[DONE]"), SSE, (True, None)),
    (sse(CHUNK), SSE, (False, None)),  # the stream stopped before [DONE]
    (sse(CHUNK, {"error": {"message": "Internal server error: engine process died", "code": 500}}), SSE, (False, 500)),
    (sse({"error": {"message": "The engine is not available", "code": 503}}, "[DONE]"), SSE, (False, 503)),
    (ndjson({"response": "a", "done": False}, {"response": "", "done": True}), NDJSON, (True, None)),
    (ndjson({"response": "a", "done": False}), NDJSON, (False, None)),
    (ndjson({"response": "a", "done": False}, {"error": "the engine failed this request"}), NDJSON,
     (False, "the engine failed this request")),
    (ndjson({"status": "reading model"}, {"status": "success"}), NDJSON, (True, None)),
    (json.dumps({"choices": []}), JSON, (True, None)),
    (json.dumps({"error": {"message": "bad", "code": 400}}), JSON, (False, 400)),
    (json.dumps({"error": "model 'x' not found"}), JSON, (False, "model 'x' not found")),
    ('{"choices": [', JSON, (False, None)),
    ("Ollama is running", "text/plain", (True, None)),
    ("", "", (True, None)),  # HEAD, or a 200 without a body
])
def test_read_answer(text, content_type, expected):
    assert read_answer(text, content_type) == expected


@pytest.mark.parametrize("outcome, expected", [
    (Outcome(200, answered=True), "completed"),
    (Outcome(200), "cut off silently"),  # a 2xx whose answer ended early, with no error in it
    (Outcome(None, body="RemoteProtocolError: peer closed connection"), "cut off silently"),
    (Outcome(None, hung=True), "hung"),
    (Outcome(None, left_on_purpose=True), "left on purpose"),
    (Outcome(200, left_on_purpose=True), "left on purpose"),
    (Outcome(503, retry_after=True, body_error=503), "rejected busy"),
    (Outcome(503, body_error=503), "errored explicitly"),  # no engine serves (restarting): not busy
    (Outcome(200, body_error=503), "errored explicitly"),
    (Outcome(504, body_error=504), "errored explicitly"),  # --request-timeout
    (Outcome(200, body_error=504), "errored explicitly"),
    (Outcome(200, body_error="the engine is not available"), "errored explicitly"),
    (Outcome(400, body_error=400), "errored explicitly"),
    (Outcome(404, body_error="model 'x' not found"), "errored explicitly"),
    (Outcome(400, body_error=400, generated=True), "rejected invalid"),
    (Outcome(422, generated=True), "rejected invalid"),
    (Outcome(500, body_error=500), "unexpected 5xx"),
    (Outcome(500, body_error=500, generated=True), "unexpected 5xx"),
    (Outcome(502), "unexpected 5xx"),
    (Outcome(200, body_error=500), "unexpected 5xx"),  # an error event with code 500 in a stream
    (Outcome(500, body_error=500, during_kill=True), "errored explicitly"),  # in flight when the engine was killed
    (Outcome(200, body_error=500, during_kill=True), "errored explicitly"),
])
def test_classify(outcome, expected):
    assert classify(outcome) == expected
