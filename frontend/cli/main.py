"""The `tinyvllm` command."""
import argparse
import dataclasses
import os
import sys

from tinyvllm.frontend.cli import verbs as cli_verbs, worker_command

from tinyvllm.frontend.api import router_registration
from tinyvllm.frontend.api.auth import resolve_api_key
from tinyvllm.frontend.api.server_options import SERVER_KNOBS, ServerArgs
from tinyvllm.protocol.engine_config import EngineConfig, add_engine_flags
from tinyvllm.protocol.knobs import add_flags, options_from


def build_parser() -> argparse.ArgumentParser:
    from tinyvllm.frontend.cli.bench import serve as bench_serve, throughput as bench_throughput
    parser = argparse.ArgumentParser(prog="tinyvllm", description="A small, fast LLM server on tinygrad.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                                formatter_class=_RawDefaults)
    add_engine_flags(serve)
    add_flags(serve, SERVER_KNOBS)
    router_registration.add_serve_arguments(serve)
    from tinyvllm.frontend.router import command as router_command
    router_command.add_arguments(commands.add_parser(
        "router", help="one address in front of many `tinyvllm serve` instances (load- and cache-aware routing)",
        description=router_command.DESCRIPTION, formatter_class=_RawDefaults))
    worker_command.add_arguments(commands.add_parser(
        "worker", help="run one worker for a `tinyvllm serve --external-workers` (on this or another machine)",
        description=worker_command.DESCRIPTION, formatter_class=_RawDefaults))
    cli_verbs.add_parsers(commands)
    bench = commands.add_parser("bench", help="benchmark a server (serve) or the engine offline (throughput)")
    benches = bench.add_subparsers(dest="bench", required=True)
    bench_serve.add_arguments(benches.add_parser(
        "serve", help="load any OpenAI-compatible server with random prompts; report TTFT, TPOT, ITL, throughput",
        description=bench_serve.__doc__, formatter_class=_RawDefaults))
    throughput = benches.add_parser("throughput", help="offline throughput through the LLM API",
                                    description=bench_throughput.__doc__, formatter_class=_RawDefaults)
    add_engine_flags(throughput, exclude=("external_workers", "worker_address", "worker_secret"))
    bench_throughput.add_arguments(throughput)
    return parser


class _RawDefaults(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the description's layout (the usage example) and shows a flag's default, unless it is None, a switch's
    bool, or the help already says it."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in cli_verbs.VERBS:
        return cli_verbs.run(args)
    if args.command == "bench":
        if args.bench == "serve":
            from tinyvllm.frontend.cli.bench.serve import run
            return run(args)
        from tinyvllm.frontend.cli.bench.throughput import run
        try:
            engine_config = EngineConfig.from_namespace(args)
        except ValueError as e:  # a knob's text that does not parse (say, --speculative-config's JSON)
            print(f"tinyvllm: error: {e}", file=sys.stderr)
            return 2
        return run(args, engine_config)
    if args.command == "worker":
        return worker_command.run(args)
    if args.command == "router":
        from tinyvllm.frontend.router import command as router_command
        return router_command.run(args)
    if args.command == "serve":
        try:
            api_key = resolve_api_key(args.api_key, os.environ)
            engine_config = EngineConfig.from_namespace(args, os.environ)
            registration = router_registration.registration_from(args.register_with, args.advertise_url,
                                                                 args.register_secret, args.host, args.port,
                                                                 os.environ)
        except ValueError as e:
            print(f"tinyvllm: error: {e}", file=sys.stderr)
            return 2
        server_args = dataclasses.replace(options_from(ServerArgs, SERVER_KNOBS, args), api_key=api_key,
                                          registration=registration)
        if engine_config.model.model is None and server_args.models_dir is not None:
            from tinyvllm.frontend.router.on_demand_server import serve_models_on_demand as serve
        elif server_args.keep_alive is not None or server_args.max_loaded_models:
            print("tinyvllm: error: --keep-alive and --max-loaded-models are for --models-dir without --model",
                  file=sys.stderr)
            return 2
        else:
            from tinyvllm.frontend.api.server import serve
        try:
            serve(engine_config, server_args)
        except (ValueError, FileNotFoundError, RuntimeError) as e:
            print(f"tinyvllm: error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
