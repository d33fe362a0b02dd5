"""The Ollama-style verbs of the `tinyvllm` command: run, list (ls), ps, show, create. All talk to a server over
its Ollama /api routes, found at --host, else $TINYVLLM_HOST, else http://127.0.0.1:8000."""
from __future__ import annotations

import argparse
import os
import sys

from tinyvllm.frontend.cli import models as cli_models
from tinyvllm.frontend.cli.client import API_KEY_ENV, HOST_ENV, CliError, OllamaApi, is_local, resolve_host

VERBS = ("run", *cli_models.VERBS)


def add_host(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None,
                        help=f"the server, as http://HOST:PORT or HOST:PORT (default: ${HOST_ENV}, else "
                             "http://127.0.0.1:8000); its API key, if any, from $" + API_KEY_ENV)


def add_parsers(commands) -> None:
    run = commands.add_parser("run", help="chat with a model in the terminal, or answer one prompt (as `ollama "
                                          "run`); starts `tinyvllm serve` if no server answers at a local host")
    run.add_argument("model", nargs="?", default=None,
                     help="a model `tinyvllm list` shows (default: the served one); with no server running, also "
                          "a .gguf file or model folder to serve")
    run.add_argument("prompt", nargs="*", help="answer this prompt (after any text piped to stdin) and exit")
    run.add_argument("--verbose", action="store_true", help="print timings and token rates after each reply")
    run.add_argument("--format", choices=("json",), default=None, help="answer in JSON")
    run.add_argument("--no-serve", dest="serve", action="store_false",
                     help="fail instead of starting `tinyvllm serve` when no server answers")
    add_host(run)
    cli_models.add_parsers(commands, add_host)


def run(args: argparse.Namespace) -> int:
    """The verb args.command names; 1 with one `Error:` line on stderr when it fails."""
    api = None
    try:
        api = OllamaApi(resolve_host(args.host, os.environ), os.environ.get(API_KEY_ENV) or None)
        if args.command == "run":
            return run_chat(api, args)
        return cli_models.VERBS[args.command](api, args)
    except CliError as e:
        return cli_models.report(e)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tinyvllm list | head`
        sys.stderr.close()
        return 0
    finally:
        if api is not None:
            api.close()


def served_model(api: OllamaApi) -> str:
    models = api.get("/api/ps").get("models", [])
    if not models:
        raise CliError(f"the server at {api.base_url} runs no model")
    return models[0]["name"]


def run_chat(api: OllamaApi, args: argparse.Namespace) -> int:
    from tinyvllm.frontend.cli import chat as cli_chat
    from tinyvllm.frontend.cli.local_server import serve_model_argument, start_local_server
    local_server, model = None, args.model
    try:
        if not api.answers():
            if not (args.serve and is_local(api.base_url)):
                api.get("/api/version")  # raises ServerDown with the message
            serve_model = serve_model_argument(model)
            local_server = start_local_server(api, serve_model)
            if serve_model is not None:  # a path: chat with the name the server gave it
                model = None
        model = model or served_model(api)
        cli_chat.check_model(api, model)
        session = cli_chat.ChatSession(api, model, verbose=args.verbose, format=args.format)
        prompt = cli_chat.one_shot_prompt(args.prompt, sys.stdin)
        if prompt is not None:
            if prompt.strip():
                session.send(prompt)
                print()
            return 0
        return cli_chat.interactive_chat(session)
    finally:
        if local_server is not None:
            local_server.stop()
