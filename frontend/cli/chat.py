"""`tinyvllm run [MODEL] [PROMPT...]`: a chat in the terminal over /api/chat, as `ollama run`.

With a prompt (or text piped to stdin) it answers once and exits; otherwise it reads messages and /commands
(frontend/cli/repl.py) until /bye or Ctrl-D. Replies stream as they are generated; Ctrl-C stops one.
"""
from __future__ import annotations

import os
import sys
from typing import TextIO

from tinyvllm.frontend.cli import repl as cli_repl, tables as cli_tables
from tinyvllm.frontend.cli.client import CliError, NotFound, OllamaApi

_STATS = (("total duration", "total_duration"), ("load duration", "load_duration"),
          ("prompt eval count", "prompt_eval_count"), ("prompt eval duration", "prompt_eval_duration"),
          ("prompt eval rate", ("prompt_eval_count", "prompt_eval_duration")), ("eval count", "eval_count"),
          ("eval duration", "eval_duration"), ("eval rate", ("eval_count", "eval_duration")))


def stats_text(final: dict) -> str:
    """/set verbose: the timings of the last reply, as `ollama run --verbose` prints them."""
    lines = []
    for label, key in _STATS:
        if isinstance(key, tuple):
            count, ns = final.get(key[0]), final.get(key[1])
            value = f"{count / (ns / 1e9):.2f} tokens/s" if count and ns else None
        elif key.endswith("count"):
            value = f"{final[key]} token(s)" if key in final else None
        else:
            value = f"{final[key] / 1e9:.6g}s" if final.get(key) is not None else None
        if value is not None:
            lines.append(f"{label + ':':<22}{value}")
    return "\n".join(lines) + "\n"


class ChatSession:
    """One conversation with a model: its messages so far and the settings /set changed."""

    def __init__(self, api: OllamaApi, model: str, out: TextIO | None = None, err: TextIO | None = None,
                 verbose: bool = False, format: str | None = None):
        self.api, self.model, self.out, self.err = api, model, out or sys.stdout, err or sys.stderr
        self.messages: list[dict] = []
        self.options: dict = {}
        self.system: str | None = None
        self.verbose, self.format, self.keep_history = verbose, format, True

    def request(self, prompt: str) -> dict:
        system = [{"role": "system", "content": self.system}] if self.system else []
        body = {"model": self.model, "messages": system + self.messages + [{"role": "user", "content": prompt}],
                "stream": True}
        if self.options:
            body["options"] = dict(self.options)
        if self.format:
            body["format"] = self.format
        return body

    def send(self, prompt: str) -> str:
        """Streams the reply to out and keeps the turn. CliError on a failure; a KeyboardInterrupt stops the reply
        (the turn is then forgotten)."""
        pieces, final = [], {}
        try:
            for chunk in self.api.stream("/api/chat", self.request(prompt)):
                if text := (chunk.get("message") or {}).get("content", ""):
                    self.out.write(text)
                    self.out.flush()
                    pieces.append(text)
                if chunk.get("done"):
                    final = chunk
        except CliError:
            if pieces:  # the error line goes below the reply's start
                self.out.write("\n")
            raise
        reply = "".join(pieces)
        self.messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
        if self.verbose:
            self.out.write("\n")
            self.err.write("\n" + stats_text(final))
        return reply

    def handle(self, action: cli_repl.Action) -> bool:
        """Does what one REPL entry asks; False when the chat should end."""
        kind, say = action.kind, self.out.write
        if kind == "bye":
            return False
        if kind == "message":
            self.send(action.value)
            say("\n\n")
        elif kind == "print":
            say(action.value)
        elif kind == "clear":
            self.messages = []
            say("Cleared session context\n")
        elif kind == "parameter":
            self.options[action.name] = action.value
            shown = ", ".join(action.value) if isinstance(action.value, list) else action.value
            say(f"Set parameter '{action.name}' to '{shown}'\n")
        elif kind == "system":
            self.system = action.value
            say("Set system message.\n")
        elif kind == "verbose":
            self.verbose = action.value
            say(f"Set '{'verbose' if action.value else 'quiet'}' mode.\n")
        elif kind == "format":
            self.format = action.value
            say("Set format to 'json' mode.\n" if action.value else "Disabled format.\n")
        elif kind == "history":
            self.keep_history = action.value
            say(f"Set '{'history' if action.value else 'nohistory'}' mode.\n")
        elif kind == "show":
            say(self.show(action.value))
        elif kind == "load":
            self.api.post("/api/show", {"model": action.value})
            self.model, self.messages = action.value, []
            say(f"Loading model '{action.value}'\n")
        elif kind == "save":
            self.api.post("/api/create", {"model": action.value, "from": self.model, "system": self.system,
                                          "parameters": self.options or None, "stream": False})
            say(f"Created new model '{action.value}'\n")
        return True

    def show(self, what: str) -> str:
        reply = self.api.post("/api/show", {"model": self.model})
        if what == "info":
            return cli_tables.show_text(reply)
        if what == "parameters":
            session = "\n".join(f"{name:<30} {value}" for name, value in self.options.items())
            text = "\n".join(part for part in (reply.get("parameters", ""), session) if part)
            return f"Model defined parameters:\n{text}\n" if text else "No parameters were specified for this model.\n"
        if what == "system":
            system = self.system or reply.get("system")
            return f"{system}\n" if system else "No system message was specified for this model.\n"
        text = reply.get(what, "")
        return f"{text.rstrip()}\n" if text else f"No {what} was specified for this model.\n"


def chat_loop(session: ChatSession, read_line=input) -> int:
    """Reads entries until /bye or end of input; 0 then. A failed request is reported and the chat goes on."""
    while True:
        try:
            entry = cli_repl.read_input(read_line)
        except KeyboardInterrupt:
            session.out.write("\nUse Ctrl + d or /bye to exit.\n")
            continue
        except EOFError:
            session.out.write("\n")
            return 0
        if not entry.strip():
            continue
        try:
            if not session.handle(cli_repl.parse(entry)):
                return 0
        except KeyboardInterrupt:  # Ctrl-C while a reply streams: stop it, keep chatting
            session.out.write("\n\n")
        except CliError as e:
            session.out.flush()
            session.err.write(f"Error: {e}\n")


def one_shot_prompt(words: list[str], stdin: TextIO) -> str | None:
    """The prompt of a non-interactive run: piped stdin, then the words after MODEL; None for a chat."""
    piped = None if stdin.isatty() else stdin.read()
    parts = [part for part in (piped, *words) if part]
    if parts:
        return " ".join(parts)
    return None if piped is None else ""  # an empty pipe: nothing to answer


def check_model(api: OllamaApi, model: str) -> None:
    try:
        api.post("/api/show", {"model": model})
    except NotFound as e:
        raise CliError(f"{e} (`tinyvllm list` shows the models this server has)") from None


def history_file() -> str:
    from tinyvllm.frontend.api.ollama.model_store import default_models_dir
    return str(default_models_dir().parent / "history")


def interactive_chat(session: ChatSession) -> int:
    """chat_loop with readline's line editing and history (kept in ~/.cache/tinyvllm/history)."""
    import readline
    path = history_file()
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    try:
        return chat_loop(session)
    finally:
        if session.keep_history:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                readline.set_history_length(1000)
                readline.write_history_file(path)
            except OSError:
                pass
