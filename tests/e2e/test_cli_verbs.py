"""`tinyvllm run/list/ps/show/create` as processes against the shared test server: the chat driven through a
pseudo-terminal (pexpect), greedy replies compared with /api/chat's, the tables with the /api routes' answers."""
import os
import subprocess
import sys

import httpx
import pexpect

from tests.e2e.server_process import MODEL_NAME, REPO, REQUEST_TIMEOUT_S, free_port

SERVED = MODEL_NAME + ":latest"


def cli_env(tmp_path) -> dict:
    return {**os.environ, "TERM": "dumb", "XDG_CACHE_HOME": str(tmp_path / "cache")}  # history under tmp_path


def tinyvllm(tmp_path, *args, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tinyvllm.frontend.cli.main", *args], cwd=REPO, env=cli_env(tmp_path),
                          input=stdin, capture_output=True, text=True, timeout=REQUEST_TIMEOUT_S)


def api_reply(url: str, model: str, messages: list[dict], options: dict | None = None) -> str:
    body = {"model": model, "messages": messages, "stream": False, "options": options or {}}
    reply = httpx.post(url + "/api/chat", json=body, timeout=REQUEST_TIMEOUT_S)
    assert reply.status_code == 200, reply.text
    return reply.json()["message"]["content"]


def turn(chat: pexpect.spawn, *lines: str) -> str:
    """Sends the lines of one entry; returns what was printed after them, up to the next prompt."""
    for line in lines[:-1]:
        chat.sendline(line)
        chat.expect_exact("... ")
    chat.sendline(lines[-1])
    chat.expect_exact(">>> ")
    return chat.before.replace("\r\n", "\n").split("\n", 1)[1]  # without the echoed line


def test_chat_in_a_terminal(server, tmp_path):
    chat = pexpect.spawn(sys.executable, ["-m", "tinyvllm.frontend.cli.main", "run", MODEL_NAME, "--host", server.url],
                         cwd=str(REPO), env=cli_env(tmp_path), encoding="utf-8", timeout=REQUEST_TIMEOUT_S)
    try:
        chat.expect_exact(">>> ")
        assert turn(chat, "/set parameter num_predict 6") == "Set parameter 'num_predict' to '6'\n"
        assert turn(chat, "/set parameter temperature 0") == "Set parameter 'temperature' to '0.0'\n"
        greedy = {"num_predict": 6, "temperature": 0}
        first = api_reply(server.url, MODEL_NAME, [{"role": "user", "content": "Hello there"}], greedy)
        assert first.strip() and turn(chat, "Hello there") == first.replace("\r\n", "\n") + "\n\n"
        history = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": first},
                   {"role": "user", "content": "Tell me\nmore"}]
        second = api_reply(server.url, MODEL_NAME, history, greedy)
        assert turn(chat, '"""Tell me', 'more"""') == second.replace("\r\n", "\n") + "\n\n"
        assert turn(chat, "/set parameter temperature 0.2") == "Set parameter 'temperature' to '0.2'\n"
        assert turn(chat, "/clear") == "Cleared session context\n"
        assert "context length" in turn(chat, "/show info")
        chat.sendline("/bye")
        chat.expect(pexpect.EOF)
    finally:
        chat.close(force=True)
    assert chat.exitstatus == 0
    assert "Hello there" in (tmp_path / "cache" / "tinyvllm" / "history").read_text()


def test_list_ps_and_show_print_what_the_api_says(server, tmp_path):
    tags = httpx.get(server.url + "/api/tags", timeout=30).json()["models"]
    listed = tinyvllm(tmp_path, "list", "--host", server.url)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    assert [row.split()[:2] for row in rows] == [[m["name"], m["digest"][:12]] for m in tags]

    (running,) = httpx.get(server.url + "/api/ps", timeout=30).json()["models"]
    ps = tinyvllm(tmp_path, "ps", "--host", server.url.removeprefix("http://"))  # OLLAMA_HOST's host:port
    assert ps.returncode == 0, ps.stderr
    header, row = ps.stdout.splitlines()
    assert header.split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
    assert row.startswith(f"{SERVED}    {running['digest'][:12]}") and f"    {running['context_length']}    " in row
    assert running["size_vram"] == 0 and "100% CPU" in row  # the test server runs on DEV=CPU

    shown = httpx.post(server.url + "/api/show", json={"model": MODEL_NAME}, timeout=30).json()
    show = tinyvllm(tmp_path, "show", MODEL_NAME, "--host", server.url)
    assert show.returncode == 0, show.stderr
    lines = [line.split(None, 1) if "length" not in line else line.rsplit(None, 1) for line in show.stdout.splitlines()]
    info = shown["model_info"]
    for expected in (["architecture", info["general.architecture"]],
                     ["context length", str(info["llama.context_length"])],
                     ["quantization", shown["details"]["quantization_level"]]):
        assert [part.strip() for part in expected] in [[p.strip() for p in line] for line in lines], show.stdout


def test_create_from_a_modelfile_then_list_and_one_shot(server, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {MODEL_NAME}\nPARAMETER temperature 0\nPARAMETER num_predict 5\n"
                                        "SYSTEM You are terse.\n")
    try:
        created = tinyvllm(tmp_path, "create", "cli-terse", "-f", str(tmp_path / "Modelfile"), "--host", server.url)
        assert created.returncode == 0 and created.stdout.splitlines()[-1] == "success", created.stderr
        listed = tinyvllm(tmp_path, "ls", "--host", server.url)
        assert "cli-terse:latest" in [row.split()[0] for row in listed.stdout.splitlines()[1:]]
        expected = api_reply(server.url, "cli-terse", [{"role": "user", "content": "Hi"}])
        one_shot = tinyvllm(tmp_path, "run", "cli-terse", "Hi", "--host", server.url)
        assert (one_shot.returncode, one_shot.stdout, one_shot.stderr) == (0, expected + "\n", "")
        piped = tinyvllm(tmp_path, "run", "cli-terse", "--host", server.url, stdin="Hi")
        assert (piped.returncode, piped.stdout) == (0, expected + "\n")
    finally:
        httpx.request("DELETE", server.url + "/api/delete", json={"model": "cli-terse"}, timeout=30)


def test_errors_are_one_line_and_a_nonzero_exit(server, tmp_path):
    unknown = tinyvllm(tmp_path, "run", "no-such-model", "Hi", "--host", server.url)
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.startswith("Error: model 'no-such-model' not found") and unknown.stderr.count("\n") == 1
    port = free_port()
    down = subprocess.run([sys.executable, "-m", "tinyvllm.frontend.cli.main", "list"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**cli_env(tmp_path), "TINYVLLM_HOST": f"127.0.0.1:{port}"})
    assert down.returncode == 1 and down.stdout == "" and "Traceback" not in down.stderr
    assert down.stderr == f"Error: could not connect to a tinyvllm server at http://127.0.0.1:{port}: is `tinyvllm " \
                          "serve` running? (set --host or TINYVLLM_HOST)\n"
