"""Load a running OpenAI-compatible server with N concurrent streams and print a table.

    python benchmarks/bench_serve.py --url http://127.0.0.1:8000 --concurrency 1 16 --max-tokens 64

Each stream sends the same kind of request (a fixed chat prompt, ignore_eos so every stream makes exactly
max_tokens tokens). Reported per concurrency level: aggregate output tokens/s, per-stream decode tokens/s
(after the first token), and TTFT median. A warm-up round runs first so JIT compilation is not measured.
"""
import argparse
import asyncio
import json
import statistics
import time

import httpx


async def one_stream(client: httpx.AsyncClient, url: str, model: str, max_tokens: int, i: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": f"Write a long story about the number {i}."}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    start, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content") and first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    return {"ttft": (first or end) - start, "tokens": tokens, "decode_s": end - (first or end), "total_s": end - start}


async def level(url: str, model: str, concurrency: int, max_tokens: int) -> dict:
    async with httpx.AsyncClient(timeout=None) as client:
        start = time.perf_counter()
        runs = await asyncio.gather(*[one_stream(client, url, model, max_tokens, i) for i in range(concurrency)])
        wall = time.perf_counter() - start
    return {"concurrency": concurrency, "output_tok_s": sum(r["tokens"] for r in runs) / wall,
            "stream_decode_tok_s": statistics.median((r["tokens"] - 1) / r["decode_s"] for r in runs if r["decode_s"] > 0),
            "ttft_p50_s": statistics.median(r["ttft"] for r in runs), "wall_s": wall}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="model name (default: the first one /v1/models lists)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="runs per level; the table shows medians")
    args = ap.parse_args()
    async with httpx.AsyncClient() as client:
        model = args.model or (await client.get(f"{args.url}/v1/models")).json()["data"][0]["id"]
    for c in args.concurrency:  # warm-up: compiles the batch buckets this level uses
        await level(args.url, model, c, 4)
    print(f"| concurrency | output tok/s | per-stream decode tok/s | TTFT p50 (s) |  ({args.max_tokens} tokens per stream, "
          f"median of {args.repeats})")
    print("|---|---|---|---|")
    for c in args.concurrency:
        runs = [await level(args.url, model, c, args.max_tokens) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("output_tok_s", "stream_decode_tok_s", "ttft_p50_s")}
        print(f"| {c} | {med['output_tok_s']:.2f} | {med['stream_decode_tok_s']:.2f} | {med['ttft_p50_s']:.2f} |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
