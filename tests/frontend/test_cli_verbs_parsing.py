"""`tinyvllm run/list/ps/show/create` without processes or a server: hosts, the REPL's commands, the tables."""
import datetime
import io

import pytest

from tinyvllm.frontend.cli import repl as cli_repl, tables as cli_tables
from tinyvllm.frontend.cli.main import build_parser
from tinyvllm.frontend.cli.chat import one_shot_prompt, stats_text
from tinyvllm.frontend.cli.client import CliError, is_local, resolve_host
from tinyvllm.frontend.cli.local_server import serve_command, serve_model_argument

NOW = datetime.datetime(2026, 1, 15, 12, 0, 0, tzinfo=datetime.timezone.utc)


@pytest.mark.parametrize("text, url", [
    (None, "http://127.0.0.1:8000"), ("", "http://127.0.0.1:8000"),
    ("http://10.0.0.5:9000", "http://10.0.0.5:9000"), ("10.0.0.5:9000", "http://10.0.0.5:9000"),
    ("example.com", "http://example.com:8000"), (":9000", "http://127.0.0.1:9000"),
    ("0.0.0.0", "http://0.0.0.0:8000"), ("https://example.com", "https://example.com:443"),
    ("http://example.com", "http://example.com:80"), ("[::1]:9000", "http://[::1]:9000"),
    ("HTTP://box:1/prefix/", "http://box:1/prefix"),
])
def test_hosts_as_ollama_host_reads_them(text, url):
    assert resolve_host(text, {}) == url


def test_the_flag_wins_over_the_environment():
    env = {"TINYVLLM_HOST": "box:7000"}
    assert resolve_host(None, env) == "http://box:7000"
    assert resolve_host("other:1", env) == "http://other:1"


@pytest.mark.parametrize("bad", ["ftp://box:1", "box:notaport"])
def test_a_bad_host_is_one_clear_error(bad):
    with pytest.raises(CliError, match="invalid host"):
        resolve_host(bad, {})


def test_local_hosts():
    assert is_local("http://127.0.0.1:8000") and is_local("http://localhost:1") and is_local("http://[::1]:2")
    assert not is_local("http://10.0.0.5:8000")


def test_the_verbs_parse_as_ollama_spells_them():
    parse = build_parser().parse_args
    run = parse(["run", "tiny", "why", "is", "the", "sky", "blue", "--host", "h:1", "--verbose"])
    assert (run.command, run.model, run.prompt, run.host, run.verbose, run.serve) == \
        ("run", "tiny", ["why", "is", "the", "sky", "blue"], "h:1", True, True)
    assert parse(["run"]).model is None and parse(["run", "--no-serve"]).serve is False
    assert parse(["ls"]).command == "ls" and parse(["list"]).command == "list" and parse(["ps"]).host is None
    show = parse(["show", "tiny", "--modelfile"])
    assert show.model == "tiny" and show.modelfile and not show.verbose
    create = parse(["create", "pirate", "-f", "pirate.Modelfile"])
    assert (create.model, create.file) == ("pirate", "pirate.Modelfile")
    assert parse(["create", "pirate"]).file == "Modelfile"


@pytest.mark.parametrize("line, kind, value, name", [
    ("hello there", "message", "hello there", ""),
    ('"""one line"""', "message", "one line", ""),
    ("/bye", "bye", None, ""), ("/exit", "bye", None, ""), ("/clear", "clear", None, ""),
    ("/set parameter temperature 0.2", "parameter", 0.2, "temperature"),
    ("/set parameter num_predict 16", "parameter", 16, "num_predict"),
    ("/set parameter top_p 0.5", "parameter", 0.5, "top_p"),
    ("/set parameter seed 42", "parameter", 42, "seed"),
    ('/set parameter stop "<|end|>" END', "parameter", ["<|end|>", "END"], "stop"),
    ("/set system You are a pirate.", "system", "You are a pirate.", ""),
    ('/set system """Be\nbrief."""', "system", "Be\nbrief.", ""),
    ("/set verbose", "verbose", True, ""), ("/set quiet", "verbose", False, ""),
    ("/set format json", "format", "json", ""), ("/set noformat", "format", None, ""),
    ("/set nohistory", "history", False, ""),
    ("/show info", "show", "info", ""), ("/show modelfile", "show", "modelfile", ""),
    ("/load other", "load", "other", ""), ("/save mine", "save", "mine", ""),
])
def test_repl_entries(line, kind, value, name):
    assert cli_repl.parse(line) == cli_repl.Action(kind, value, name)


@pytest.mark.parametrize("line, shown", [
    ("/?", "Available Commands:"), ("/help", "/bye"), ("/? shortcuts", "Ctrl + d"), ("/set", "/set parameter ..."),
    ("/show", "/show info"), ("/show nothing", "/show info"), ("/set parameter", "Available Parameters:"),
    ("/set parameter temperature", "Available Parameters:"), ("/load", "Usage:"),
    ("/set parameter temperature hot", "Couldn't set parameter"),
    ("/set parameter flux 1", "Couldn't set parameter: unknown parameter 'flux'"),
    ("/frobnicate", "Unknown command '/frobnicate'. Type /? for help"),
])
def test_repl_help_and_mistakes_print_a_message(line, shown):
    action = cli_repl.parse(line)
    assert action.kind == "print" and shown in action.value


def test_multi_line_input_with_triple_quotes():
    lines = iter(['"""Roses are red,', "violets are blue", 'done"""', "next"])
    prompts = []

    def read_line(prompt):
        prompts.append(prompt)
        return next(lines)

    entry = cli_repl.read_input(read_line)
    assert entry == '"""Roses are red,\nviolets are blue\ndone"""' and prompts == [">>> ", "... ", "... "]
    assert cli_repl.parse(entry).value == "Roses are red,\nviolets are blue\ndone"
    assert cli_repl.read_input(read_line) == "next"
    alone = iter(['"""', "a", '"""'])
    assert cli_repl.parse(cli_repl.read_input(lambda p: next(alone))).value == "a"


class _Stdin(io.StringIO):
    def __init__(self, text, tty):
        super().__init__(text)
        self.tty = tty

    def isatty(self):
        return self.tty


def test_one_shot_prompts():
    assert one_shot_prompt([], _Stdin("", tty=True)) is None
    assert one_shot_prompt(["why", "blue?"], _Stdin("", tty=True)) == "why blue?"
    assert one_shot_prompt(["summarize:"], _Stdin("a long text\n", tty=False)) == "a long text\n summarize:"
    assert one_shot_prompt([], _Stdin("", tty=False)) == ""
    assert one_shot_prompt(["Hi"], _Stdin("", tty=False)) == "Hi"


def test_human_sizes_and_times():
    assert [cli_tables.human_bytes(n) for n in (7, 1000, 1500, 42_000_000, 2_000_000_000, 123_456_789_000)] == \
        ["7 B", "1 KB", "1.5 KB", "42 MB", "2 GB", "123 GB"]
    ago = lambda **kw: (NOW - datetime.timedelta(**kw)).isoformat()  # noqa: E731
    assert cli_tables.human_time(ago(seconds=0.2), NOW) == "Less than a second ago"
    assert cli_tables.human_time(ago(seconds=90), NOW) == "About a minute ago"
    assert cli_tables.human_time(ago(minutes=5), NOW) == "5 minutes ago"
    assert cli_tables.human_time(ago(hours=1), NOW) == "About an hour ago"
    assert cli_tables.human_time(ago(days=3), NOW) == "3 days ago"
    assert cli_tables.human_time(ago(days=15), NOW) == "2 weeks ago"
    assert cli_tables.human_time(ago(minutes=-4), NOW) == "4 minutes from now"
    assert cli_tables.human_time("2318-01-01T00:00:00Z", NOW) == "Forever"
    assert cli_tables.human_time("2026-01-15T11:58:00.123456789Z", NOW) == "About a minute ago"
    assert cli_tables.human_time("", NOW) == "Never"


def test_list_and_ps_tables():
    model = {"name": "tiny:latest", "digest": "b111b0f57622742332e2", "size": 8_200_000,
             "modified_at": "2026-01-15T11:58:00Z", "expires_at": "2318-01-01T00:00:00Z", "size_vram": 8_200_000,
             "context_length": 512}
    assert cli_tables.list_table([model], NOW).splitlines() == [
        "NAME           ID              SIZE      MODIFIED",
        "tiny:latest    b111b0f57622    8.2 MB    2 minutes ago"]
    assert cli_tables.ps_table([model], NOW).splitlines() == [
        "NAME           ID              SIZE      PROCESSOR    CONTEXT    UNTIL",
        "tiny:latest    b111b0f57622    8.2 MB    100% GPU     512        Forever"]
    assert cli_tables.processor(100, 0) == "100% CPU" and cli_tables.processor(100, 25) == "75%/25% CPU/GPU"


def test_show_text_has_ollamas_sections():
    reply = {"model_info": {"general.architecture": "llama", "llama.context_length": 8192,
                            "llama.embedding_length": 576.0},
             "details": {"parameter_size": "135M", "quantization_level": "Q8_0"}, "capabilities": ["completion"],
             "parameters": 'temperature                    0.2\nstop                           "<|im_end|>"',
             "system": "Line one.\nLine two.\nLine three.", "license": "MIT"}
    text = cli_tables.show_text(reply)
    assert text.splitlines()[:6] == ["  Model", "    architecture        llama", "    parameters          135M",
                                     "    context length      8192", "    embedding length    576",
                                     "    quantization        Q8_0"]
    assert "  Parameters\n    temperature    0.2\n    stop           \"<|im_end|>\"\n" in text
    assert "  System\n    Line one.\n    Line two.\n    ...\n" in text and "  License\n    MIT\n" in text
    assert "Line three." in cli_tables.show_text(reply, verbose=True)


def test_verbose_stats():
    text = stats_text({"total_duration": 2_500_000_000, "eval_count": 10, "eval_duration": 500_000_000})
    assert "total duration:       2.5s" in text and "eval count:           10 token(s)" in text
    assert "eval rate:            20.00 tokens/s" in text


def test_the_local_server_command():
    assert serve_model_argument(None) is None and serve_model_argument("llama3.2") is None
    assert serve_model_argument("SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    command = serve_command("http://localhost:9000", "/models/x.gguf")
    assert command[1:] == ["-m", "tinyvllm.frontend.cli.main", "serve", "--host", "localhost", "--port", "9000",
                           "--model", "/models/x.gguf"]
