"""The verbs against a fake Ollama server (httpx.MockTransport): what each sends and prints. Plus the errors of a
server that is down, and `tinyvllm run`'s own server started and stopped (a stand-in `serve` command)."""
import io
import json
import os
import sys

import httpx
import pytest

from tests.e2e.server_process import free_port
from tinyvllm.frontend.cli import verbs as cli_verbs
from tinyvllm.frontend.cli.main import main
from tinyvllm.frontend.cli.chat import ChatSession, chat_loop
from tinyvllm.frontend.cli.client import CliError, OllamaApi
from tinyvllm.frontend.cli.local_server import LocalServer
from tinyvllm.frontend.cli.models import modelfile_from

SHOWN = {"model_info": {"general.architecture": "llama", "llama.context_length": 512},
         "details": {"parameter_size": "3.2M", "quantization_level": "F32"}, "capabilities": ["completion"],
         "parameters": "", "template": "{{ .Prompt }}", "modelfile": "FROM /m/tiny.gguf\n"}
TAGS = [{"name": "tiny:latest", "digest": "ab" * 32, "size": 8_200_000, "modified_at": "2026-01-01T00:00:00Z"}]


class FakeOllama:
    def __init__(self, reply=("Hel", "lo")):
        self.requests: list[tuple[str, dict]] = []
        self.reply = reply

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.requests.append((request.url.path, body))
        path = request.url.path
        if path == "/api/show":
            known = body["model"] in ("tiny", "tiny:latest", "pirate")
            return httpx.Response(200, json=SHOWN) if known else \
                httpx.Response(404, json={"error": f"model '{body['model']}' not found"})
        if path == "/api/chat":
            lines = [{"message": {"role": "assistant", "content": piece}, "done": False} for piece in self.reply]
            lines.append({"message": {"role": "assistant", "content": ""}, "done": True, "eval_count": 2})
            return httpx.Response(200, content="".join(json.dumps(line) + "\n" for line in lines))
        if path == "/api/tags":
            return httpx.Response(200, json={"models": TAGS})
        if path == "/api/create":
            return httpx.Response(200, content=b'{"status":"writing manifest"}\n{"status":"success"}\n')
        return httpx.Response(200, json={"version": "0.12.0"})

    def chats(self) -> list[dict]:
        return [body for path, body in self.requests if path == "/api/chat"]


def session_with(fake, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    api = OllamaApi("http://fake:1", transport=httpx.MockTransport(fake))
    return ChatSession(api, "tiny", out=out, err=err, **kwargs), out, err


def scripted(*lines):
    it = iter(lines)

    def read_line(prompt):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    return read_line


def test_settings_reach_the_requests_and_the_history_grows_until_cleared():
    fake = FakeOllama()
    session, out, _ = session_with(fake)
    code = chat_loop(session, scripted("/set parameter temperature 0.2", "/set parameter num_predict 8",
                                       "/set parameter seed 7", "/set system Be brief.", "hi", "again", "/clear",
                                       "/set format json", "fresh", "/bye", "never read"))
    assert code == 0
    first, second, third = fake.chats()
    assert first["options"] == second["options"] == {"temperature": 0.2, "num_predict": 8, "seed": 7}
    assert first["model"] == "tiny" and first["stream"] is True and "format" not in first
    assert first["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert second["messages"][1:] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"},
                                      {"role": "user", "content": "again"}]
    assert third["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "fresh"}]
    assert third["format"] == "json"
    text = out.getvalue()
    assert "Set parameter 'temperature' to '0.2'" in text and text.count("Hello\n\n") == 3
    assert "Cleared session context" in text and "Set system message." in text


def test_a_failed_reply_is_one_error_line_and_the_chat_goes_on():
    fake = FakeOllama()
    session, out, err = session_with(fake)

    def failing(request):
        if request.url.path == "/api/chat":
            return httpx.Response(200, content=b'{"message":{"content":"par"},"done":false}\n{"error":"boom"}\n')
        return fake(request)
    session.api = OllamaApi("http://fake:1", transport=httpx.MockTransport(failing))
    assert chat_loop(session, scripted("hi", "/show info", "/load nope")) == 0  # EOF ends the chat too
    assert err.getvalue() == "Error: boom\nError: model 'nope' not found\n"
    assert "par\n" in out.getvalue() and "architecture      llama" in out.getvalue()
    assert session.messages == [] and session.model == "tiny"


def test_ctrl_c_at_the_prompt_says_how_to_leave():
    session, out, _ = session_with(FakeOllama())

    def read_line(prompt, calls=[]):
        calls.append(prompt)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return "/bye"
    assert chat_loop(session, read_line) == 0
    assert "Use Ctrl + d or /bye to exit." in out.getvalue()


@pytest.fixture
def fake_server(monkeypatch):
    fake = FakeOllama()
    monkeypatch.setattr(cli_verbs, "OllamaApi",
                        lambda url, key: OllamaApi(url, key, transport=httpx.MockTransport(fake)))
    return fake


def test_list_show_and_create_print_what_the_routes_answer(fake_server, capsys, tmp_path):
    assert main(["list"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("tiny:latest    abababababab    8.2 MB    ")
    assert main(["show", "tiny"]) == 0 and "context length    512" in capsys.readouterr().out
    assert main(["show", "tiny", "--template"]) == 0 and capsys.readouterr().out == "{{ .Prompt }}\n"
    assert main(["show", "nope"]) == 1
    assert capsys.readouterr().err == "Error: model 'nope' not found\n"
    (tmp_path / "weights.gguf").write_bytes(b"GGUF")
    (tmp_path / "Modelfile").write_text("FROM ./weights.gguf\nPARAMETER temperature 0\n")
    assert main(["create", "pirate", "-f", str(tmp_path / "Modelfile")]) == 0
    assert capsys.readouterr().out.splitlines() == ["gathering model components", "writing manifest", "success"]
    path, body = fake_server.requests[-1]
    assert path == "/api/create" and body["model"] == "pirate" and body["from"] == str(tmp_path / "weights.gguf")
    assert "PARAMETER temperature 0" in body["modelfile"]


def test_run_one_shot_prints_the_answer(fake_server, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("piped text"))  # not a terminal
    assert main(["run", "tiny", "summarize"]) == 0
    assert capsys.readouterr().out == "Hello\n"
    assert fake_server.chats()[0]["messages"] == [{"role": "user", "content": "piped text summarize"}]
    assert main(["run", "nope", "hi"]) == 1
    assert capsys.readouterr().err.startswith("Error: model 'nope' not found")


def test_modelfile_mistakes_are_one_line(tmp_path):
    with pytest.raises(CliError, match="cannot read the Modelfile"):
        modelfile_from(str(tmp_path / "missing"))
    (tmp_path / "Modelfile").write_text("PARAMETER temperature 0\n")
    with pytest.raises(CliError, match="no FROM line"):
        modelfile_from(str(tmp_path / "Modelfile"))
    (tmp_path / "Modelfile").write_text("FROM tiny\n")
    assert modelfile_from(str(tmp_path / "Modelfile")) == ("FROM tiny\n", None)  # a model name, not a path


@pytest.mark.parametrize("argv", [["list"], ["ps"], ["show", "tiny"], ["run", "--no-serve"], ["run", "tiny", "hi",
                                                                                              "--no-serve"]])
def test_a_server_that_is_down_is_one_line_and_exit_1(argv, capsys):
    url = f"127.0.0.1:{free_port()}"
    assert main([*argv, "--host", url]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"Error: could not connect to a tinyvllm server at http://{url}")


FAKE_SERVE = """
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"version": "0"}')
    def log_message(self, *args): pass
print("fake serve up", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_runs_own_server_is_waited_for_and_stopped():
    port = free_port()
    api = OllamaApi(f"http://127.0.0.1:{port}")
    server = LocalServer([sys.executable, "-c", FAKE_SERVE, str(port)])
    server.wait_ready(api, timeout_s=30)
    assert api.answers()
    server.stop()
    assert server.proc.returncode is not None and not api.answers()
    failing = LocalServer([sys.executable, "-c", "print('no model here'); raise SystemExit(3)"])
    with pytest.raises(CliError, match=r"exited with 3 before it was ready: no model here \(log: "):
        failing.wait_ready(api, timeout_s=30)
    failing.stop()
    assert not os.path.exists(server.log.name) and os.path.exists(failing.log.name)
    os.unlink(failing.log.name)
