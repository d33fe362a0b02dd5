"""`tinyvllm bench throughput`: offline throughput through the `LLM` API, like `vllm bench throughput`.

    tinyvllm bench throughput --num-prompts 64 --input-len 256 --output-len 64 --max-num-seqs 16 --json out.json

Starts the engine with the same engine flags as `tinyvllm serve`, makes --num-prompts random prompts of exactly
--input-len tokens (frontend/cli/bench/random_prompts.py), and times one `LLM.generate` over all of them (engine
start-up and the optional warm-up excluded). As vLLM's does, every request samples at temperature 1.0 with
ignore_eos, so each one generates exactly --output-len tokens.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import sys
import time

from tinyvllm.frontend.cli.bench.random_prompts import random_prompts
from tinyvllm.protocol.engine_config import EngineConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-prompts", type=int, default=1000, help="requests in the measured run")
    p.add_argument("--input-len", "--random-input-len", dest="input_len", type=int, default=1024,
                   help="prompt tokens per request (exact)")
    p.add_argument("--output-len", "--random-output-len", dest="output_len", type=int, default=128,
                   help="output tokens per request")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompts")
    p.add_argument("--warmup", "--num-warmups", dest="warmup", type=int, default=0,
                   help="unmeasured requests run first, with other prompts of the same lengths")
    p.add_argument("--json", default=None, metavar="PATH", help="write the configuration and results as JSON")


def measure(llm, num_prompts: int, input_len: int, output_len: int, seed: int = 0, warmup: int = 0) -> dict:
    """Runs the benchmark on a started `LLM` and returns vLLM's result keys (plus a few)."""
    from tinyvllm.protocol.sampling import SamplingParams
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=output_len, ignore_eos=True)
    if warmup:
        llm.generate([p.text for p in random_prompts(llm.tokenizer, warmup, input_len, [seed, 1])], sampling)
    prompts = random_prompts(llm.tokenizer, num_prompts, input_len, [seed, 0])
    start = time.perf_counter()
    results = llm.generate([p.text for p in prompts], sampling)
    elapsed = time.perf_counter() - start
    ok = [r for r in results if r.error is None]
    prompt_tokens, output_tokens = sum(len(r.prompt_token_ids) for r in ok), sum(len(r.token_ids) for r in ok)
    return {"elapsed_time": elapsed, "num_requests": len(ok), "failed": len(results) - len(ok),
            "total_prompt_tokens": prompt_tokens, "total_output_tokens": output_tokens,
            "total_num_tokens": prompt_tokens + output_tokens, "requests_per_second": len(ok) / elapsed,
            "tokens_per_second": (prompt_tokens + output_tokens) / elapsed,
            "output_tokens_per_second": output_tokens / elapsed,
            "errors": sorted({r.error for r in results if r.error is not None})}


def run(args: argparse.Namespace, engine_config: EngineConfig) -> int:
    for name in ("num_prompts", "input_len", "output_len"):
        if getattr(args, name) < 1:
            print(f"tinyvllm: error: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if args.warmup < 0:
        print("tinyvllm: error: --warmup must be at least 0", file=sys.stderr)
        return 2
    from tinyvllm.frontend.engine.llm import LLM
    started = time.perf_counter()
    try:
        # every bucket captured before the clock starts, never by a background warm-up during the measurement
        llm = LLM(**{**engine_config.flat(), "warmup_before_serving": True})
    except (ValueError, FileNotFoundError, RuntimeError, TimeoutError) as e:
        print(f"tinyvllm: error: {e}", file=sys.stderr)
        return 2
    with llm:
        print(f"engine ready in {time.perf_counter() - started:.1f}s", file=sys.stderr)
        if args.input_len + args.output_len > llm.ready.max_model_len:
            print(f"tinyvllm: error: --input-len + --output-len is more than max_model_len {llm.ready.max_model_len}",
                  file=sys.stderr)
            return 2
        result = measure(llm, args.num_prompts, args.input_len, args.output_len, args.seed, args.warmup)
    print(f"Throughput: {result['requests_per_second']:.2f} requests/s, {result['tokens_per_second']:.2f} total "
          f"tokens/s, {result['output_tokens_per_second']:.2f} output tokens/s")
    print(f"Total num prompt tokens:  {result['total_prompt_tokens']}")
    print(f"Total num output tokens:  {result['total_output_tokens']}")
    print(f"Elapsed: {result['elapsed_time']:.2f}s for {result['num_requests']} requests"
          + (f" ({result['failed']} failed)" if result["failed"] else ""), flush=True)
    for error in result["errors"]:
        print(f"error: {error}", file=sys.stderr)
    if args.json:
        # the engine's knobs by name, flat as in earlier results ({"max_num_seqs": 16, ...}), secrets left out
        engine = {name: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
                  for name, value in engine_config.flat().items()}
        config = {"engine": engine, "num_prompts": args.num_prompts,
                  "input_len": args.input_len, "output_len": args.output_len, "seed": args.seed,
                  "warmup": args.warmup, "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        pathlib.Path(args.json).write_text(json.dumps({"config": config, **result}, indent=1))
    return 0 if result["num_requests"] else 1
