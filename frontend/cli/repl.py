"""What a line typed at `tinyvllm run`'s prompt means, as `ollama run` reads it: a message, or a /command.

Pure functions (no I/O besides the read_line callable), so the chat loop and the tests share them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tinyvllm.frontend.api.ollama.options import OptionError, coerce_parameter

PROMPT, CONTINUATION = ">>> ", "... "
QUOTES = '"""'
SHOW_WHAT = ("info", "license", "modelfile", "parameters", "system", "template")

HELP = '''Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use """ to begin a multi-line message.
'''
SET_HELP = '''Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set history           Enable history
  /set nohistory         Disable history
  /set format json       Enable JSON mode
  /set noformat          Disable formatting
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
'''
PARAMETER_HELP = '''Available Parameters:
  /set parameter seed <int>             Random number seed
  /set parameter num_predict <int>      Max number of tokens to predict
  /set parameter top_k <int>            Pick from top k num of tokens
  /set parameter top_p <float>          Pick token based on sum of probabilities
  /set parameter min_p <float>          Pick token based on top token probability * min_p
  /set parameter temperature <float>    Set creativity level
  /set parameter repeat_penalty <float> How strongly to penalize repetitions
  /set parameter presence_penalty <float>   Penalize tokens already present
  /set parameter frequency_penalty <float>  Penalize tokens by how often they appeared
  /set parameter stop <string> <string> ...   Set the stop parameters
'''
SHOW_HELP = '''Available Commands:
  /show info         Show details for this model
  /show license      Show model license
  /show modelfile    Show Modelfile for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template
'''
SHORTCUTS_HELP = '''Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor
  Ctrl + l            Clear the screen
  Ctrl + c            Stop the model from responding
  Ctrl + d            Exit (/bye)
  Up, Down            Browse the input history
'''


@dataclass(frozen=True)
class Action:
    """kind: message, bye, clear, print (value: text to show), parameter (name, value), system, verbose (bool),
    format ("json" or None), history (bool), show (one of SHOW_WHAT), load, save (value: a model name)."""
    kind: str
    value: Any = None
    name: str = ""


def read_input(read_line: Callable[[str], str]) -> str:
    """One entry: a line, or lines from one with an unclosed \"\"\" to the line that closes it (joined with
    newlines). read_line(prompt) raises EOFError at the end of input and KeyboardInterrupt on Ctrl-C."""
    lines = [read_line(PROMPT)]
    if lines[0].count(QUOTES) % 2 == 1:
        while QUOTES not in lines[-1] or len(lines) == 1:
            lines.append(read_line(CONTINUATION))
    return "\n".join(lines)


def _unquote(text: str) -> str:
    text = text.strip()
    if text.startswith(QUOTES):
        text = text[3:]
        text = (text[:-3] if text.endswith(QUOTES) else text).strip()
    elif len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return text


def parse(text: str) -> Action:
    stripped = text.strip()
    if not stripped.startswith("/"):
        return Action("message", _unquote(text) if stripped.startswith(QUOTES) else text)
    words = stripped.split()
    command, args = words[0], words[1:]
    if command in ("/bye", "/exit"):
        return Action("bye")
    if command == "/clear":
        return Action("clear")
    if command in ("/?", "/help"):
        topics = {"set": SET_HELP, "/set": SET_HELP, "show": SHOW_HELP, "/show": SHOW_HELP,
                  "shortcuts": SHORTCUTS_HELP, "shortcut": SHORTCUTS_HELP}
        return Action("print", topics.get(args[0] if args else "", HELP))
    if command == "/set":
        return _parse_set(stripped, args)
    if command == "/show":
        if len(args) != 1 or args[0] not in SHOW_WHAT:
            return Action("print", SHOW_HELP)
        return Action("show", args[0])
    if command in ("/load", "/save"):
        if len(args) != 1:
            return Action("print", f"Usage:\n  {command} <modelname>\n")
        return Action(command[1:], args[0])
    return Action("print", f"Unknown command '{command}'. Type /? for help\n")


def _parse_set(text: str, args: list[str]) -> Action:
    if not args:
        return Action("print", SET_HELP)
    what = args[0]
    switches = {"verbose": ("verbose", True), "quiet": ("verbose", False), "history": ("history", True),
                "nohistory": ("history", False), "noformat": ("format", None)}
    if what in switches and len(args) == 1:
        return Action(*switches[what])
    if what == "format":
        return Action("format", "json") if args[1:] == ["json"] else Action("print", "Invalid or missing format. "
                                                                                    "For 'json' mode use "
                                                                                    "'/set format json'\n")
    if what == "system":
        system = _unquote(text.split("system", 1)[1])
        return Action("system", system) if system else Action("print", "Usage: /set system <message>\n")
    if what == "parameter":
        return _parse_parameter(args[1:])
    return Action("print", f"Unknown command '/set {what}'. Type /? for help\n")


def _parse_parameter(args: list[str]) -> Action:
    if len(args) < 2:
        return Action("print", PARAMETER_HELP)
    name, values = args[0], [_unquote(v) for v in args[1:]]
    try:
        if name == "stop":
            return Action("parameter", [coerce_parameter(name, v) for v in values], name)
        return Action("parameter", coerce_parameter(name, " ".join(values)), name)
    except OptionError as e:
        return Action("print", f"Couldn't set parameter: {e}\n")
