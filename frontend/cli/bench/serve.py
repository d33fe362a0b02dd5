"""`tinyvllm bench serve`: load any OpenAI-compatible server with random prompts and report latency/throughput.

    tinyvllm bench serve --base-url http://127.0.0.1:8000 --num-prompts 64 --random-input-len 256 \\
        --random-output-len 64 --ignore-eos --max-concurrency 1 4 16 --warmup 4 --json out.json

Each --max-concurrency value is one level of a sweep, run one after another against the same server: its own
warm-up requests first (not measured), then --num-prompts requests, at most that many in flight, arriving all
at once (--request-rate inf) or as a Poisson process with a seeded generator. Every level (and every warm-up)
gets its own prompts, so a prefix cache cannot serve one level from the last; the prompts depend only on the
seed, the level and the lengths, so two servers given the same flags get the same text.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import pathlib
import sys
import time

import numpy as np

from tinyvllm.frontend.cli.bench.progress import Progress
from tinyvllm.frontend.cli.bench.random_prompts import RandomPrompt, random_prompts
from tinyvllm.frontend.cli.bench.serve_client import RequestResult, Target, send_request
from tinyvllm.frontend.cli.bench.serve_report import error_summary, markdown_table, summarize


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=None, help="the server's root URL (overrides --host and --port)")
    p.add_argument("--host", default="127.0.0.1", help="the server's host, when there is no --base-url")
    p.add_argument("--port", type=int, default=8000, help="the server's port, when there is no --base-url")
    p.add_argument("--endpoint", default="/v1/completions", help="/v1/completions or /v1/chat/completions")
    p.add_argument("--model", default=None, help="the model name sent in requests; default: the first of /v1/models")
    p.add_argument("--tokenizer", default=None,
                   help="a .gguf file or Hugging Face model folder whose tokenizer makes the prompts; default: --model "
                        "if it is such a path, else tinyvllm's default model (SmolLM2-135M-Instruct)")
    p.add_argument("--num-prompts", type=int, default=1000, help="measured requests per concurrency level")
    p.add_argument("--random-input-len", type=int, default=1024, help="prompt tokens per request (exact)")
    p.add_argument("--random-output-len", type=int, default=128, help="max_tokens per request")
    p.add_argument("--max-concurrency", type=int, nargs="+", default=None,
                   help="most requests in flight; several values run a sweep, one level each (default: no limit)")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests per second, Poisson arrivals (default: inf, all at once)")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompts and the arrival times")
    p.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos so every request generates exactly --random-output-len tokens")
    p.add_argument("--warmup", "--num-warmups", dest="warmup", type=int, default=0,
                   help="unmeasured requests at each level before it is measured (compiles kernels: give at least the "
                        "level's concurrency, so its batch size is compiled too)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the configuration and results as JSON")
    p.add_argument("--disable-tqdm", "--no-progress", dest="progress", action="store_false",
                   help="no progress bar on stderr")


def auth_headers(environ) -> dict:
    """Bearer $OPENAI_API_KEY (vLLM's bench convention), else $TINYVLLM_API_KEY, else nothing."""
    key = environ.get("OPENAI_API_KEY") or environ.get("TINYVLLM_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def load_tokenizer(tokenizer: str | None, model: str | None):
    from tinyvllm.protocol.tokenizer import Tokenizer
    source = tokenizer or (model if model and pathlib.Path(model).expanduser().exists() else None)
    return Tokenizer.from_model_path(None if source is None else pathlib.Path(source).expanduser())


async def served_model(client, base_url: str, headers: dict) -> str:
    resp = await client.get(f"{base_url}/v1/models", headers=headers)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


async def run_level(client, target: Target, prompts: list[RandomPrompt], output_len: int, concurrency: int | None,
                    request_rate: float, seed, progress: Progress) -> tuple[list[RequestResult], float]:
    """Sends every prompt (Poisson arrivals unless the rate is inf; at most `concurrency` in flight) and returns
    the results in prompt order and the wall time from the first send to the last response."""
    limit = asyncio.Semaphore(concurrency) if concurrency else None
    rng = np.random.default_rng(seed)

    async def one(prompt: RandomPrompt) -> RequestResult:
        if limit is None:
            result = await send_request(client, target, prompt.text, len(prompt.token_ids), output_len)
        else:
            async with limit:
                result = await send_request(client, target, prompt.text, len(prompt.token_ids), output_len)
        progress.update(result.success)
        return result

    start, tasks = time.perf_counter(), []
    for i, prompt in enumerate(prompts):
        if i and not math.isinf(request_rate):
            await asyncio.sleep(rng.exponential(1.0 / request_rate))
        tasks.append(asyncio.create_task(one(prompt)))
    results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


async def benchmark(args, levels: list[int | None], base_url: str, headers: dict) -> tuple[dict, list[dict]]:
    import httpx
    most = max(args.num_prompts, args.warmup, 1)
    limits = httpx.Limits(max_connections=most, max_keepalive_connections=most)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=60.0), limits=limits) as client:
        model = args.model or await served_model(client, base_url, headers)
        tokenizer = load_tokenizer(args.tokenizer, model)
        target = Target(base_url + args.endpoint, model, args.endpoint.rstrip("/").endswith("chat/completions"),
                        args.ignore_eos, headers)
        config = {"base_url": base_url, "endpoint": args.endpoint, "model": model, "tokenizer": args.tokenizer,
                  "num_prompts": args.num_prompts, "random_input_len": args.random_input_len,
                  "random_output_len": args.random_output_len, "max_concurrency": levels,
                  "request_rate": None if math.isinf(args.request_rate) else args.request_rate, "seed": args.seed,
                  "ignore_eos": args.ignore_eos, "warmup": args.warmup,
                  "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        records = []
        for level in levels:
            name = f"concurrency {level or 'unlimited'}"
            if args.warmup:
                warm = random_prompts(tokenizer, args.warmup, args.random_input_len, [args.seed, level or 0, 1])
                progress = Progress(len(warm), f"{name} warm-up ", args.progress)
                await run_level(client, target, warm, args.random_output_len, level, math.inf, 0, progress)
                progress.close()
            prompts = random_prompts(tokenizer, args.num_prompts, args.random_input_len, [args.seed, level or 0, 0])
            progress = Progress(len(prompts), f"{name} ", args.progress)
            results, duration = await run_level(client, target, prompts, args.random_output_len, level,
                                                args.request_rate, [args.seed, level or 0, 2], progress)
            progress.close()
            records.append(summarize(results, duration, level, args.request_rate))
    return config, records


def run(args: argparse.Namespace) -> int:
    for name in ("num_prompts", "random_input_len", "random_output_len"):
        if getattr(args, name) < 1:
            print(f"tinyvllm: error: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if args.warmup < 0 or args.request_rate <= 0 or any(c < 1 for c in args.max_concurrency or []):
        print("tinyvllm: error: --warmup must be >= 0, --request-rate and --max-concurrency > 0", file=sys.stderr)
        return 2
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    endpoint = args.endpoint if args.endpoint.startswith("/") else "/" + args.endpoint
    args.endpoint = endpoint
    import httpx
    try:
        levels = args.max_concurrency or [None]
        config, records = asyncio.run(benchmark(args, levels, base_url, auth_headers(os.environ)))
    except (httpx.HTTPError, OSError, ValueError, KeyError, IndexError) as e:  # no server/model list/tokenizer
        print(f"tinyvllm: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    rate = "inf" if math.isinf(args.request_rate) else f"{args.request_rate:g}/s"
    print(f"{config['model']} at {base_url}{endpoint}: {args.num_prompts} requests per level, "
          f"{args.random_input_len} input / {args.random_output_len} output tokens, request rate {rate}, "
          f"ignore_eos {'on' if args.ignore_eos else 'off'}")
    print(markdown_table(records), flush=True)
    for line in error_summary(records):
        print(f"error: {line}", file=sys.stderr)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"config": config, "results": records}, indent=1))
    return 0 if all(r["completed"] for r in records) else 1
