"""`tinyvllm list`, `ps`, `show MODEL` and `create NAME -f Modelfile`, over the server's Ollama /api routes."""
from __future__ import annotations

import argparse
import pathlib
import sys

from tinyvllm.frontend.cli import tables as cli_tables
from tinyvllm.frontend.cli.client import CliError, OllamaApi

SHOW_FIELDS = ("license", "modelfile", "parameters", "system", "template")


def list_models(api: OllamaApi, args: argparse.Namespace) -> int:
    print(cli_tables.list_table(api.get("/api/tags").get("models", [])))
    return 0


def running_models(api: OllamaApi, args: argparse.Namespace) -> int:
    print(cli_tables.ps_table(api.get("/api/ps").get("models", [])))
    return 0


def show_model(api: OllamaApi, args: argparse.Namespace) -> int:
    chosen = [f for f in SHOW_FIELDS if getattr(args, f)]
    if len(chosen) > 1:
        raise CliError("only one of --license, --modelfile, --parameters, --system or --template can be given")
    reply = api.post("/api/show", {"model": args.model, "verbose": args.verbose})
    if chosen:
        text = reply.get(chosen[0], "")
        print(text.rstrip("\n") if text else f"No {chosen[0]} was specified for this model.")
    else:
        print(cli_tables.show_text(reply, args.verbose), end="")
    return 0


def modelfile_from(path_text: str) -> tuple[str, str | None]:
    """(the Modelfile's text, its FROM as the server should read it): a FROM path relative to the Modelfile's
    folder (or starting with ~) made absolute, as `ollama create` resolves it; None keeps the Modelfile's own."""
    from tinyvllm.frontend.api.ollama.modelfile import ModelfileError, parse
    path = pathlib.Path(path_text).expanduser()
    try:
        text = path.read_text()
    except OSError as e:
        raise CliError(f"cannot read the Modelfile {path}: {e.strerror or e}") from None
    try:
        from_ = parse(text).from_
    except ModelfileError as e:
        raise CliError(f"{path}: {e}") from None
    if not from_:
        raise CliError(f"{path}: no FROM line")
    local = pathlib.Path(from_).expanduser()
    local = local if local.is_absolute() else path.parent / local
    return text, str(local.resolve()) if local.exists() else None


def create_model(api: OllamaApi, args: argparse.Namespace) -> int:
    text, from_ = modelfile_from(args.file)
    body = {"model": args.model, "modelfile": text, "stream": True}
    if from_:
        body["from"] = from_
    print("gathering model components")
    for status in api.stream("/api/create", body):
        if status.get("status"):
            print(status["status"])
    return 0


def add_parsers(commands, add_host) -> None:
    add_host(commands.add_parser("list", aliases=["ls"], help="list the server's models (as `ollama list`)"))
    add_host(commands.add_parser("ps", help="list the running models (as `ollama ps`)"))
    show = commands.add_parser("show", help="show a model's details (as `ollama show`)")
    show.add_argument("model")
    for field in SHOW_FIELDS:
        show.add_argument(f"--{field}", action="store_true", help=f"show the model's {field} only")
    show.add_argument("-v", "--verbose", action="store_true", help="show the whole license and system, and the "
                                                                   "model's metadata")
    add_host(show)
    create = commands.add_parser("create", help="create a model from a Modelfile (as `ollama create`)")
    create.add_argument("model", help="the new model's name")
    create.add_argument("-f", "--file", default="Modelfile", help="the Modelfile (default: ./Modelfile)")
    add_host(create)


VERBS = {"list": list_models, "ls": list_models, "ps": running_models, "show": show_model, "create": create_model}


def report(error: CliError) -> int:
    print(f"Error: {error}", file=sys.stderr)
    return 1
