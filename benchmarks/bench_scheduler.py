"""Scheduler benchmarks against a running server (run it once per configuration, compare the tables).

  long-prompt:   a request is already streaming; a long prompt arrives, then a short request right behind it.
                 Reports the short request's TTFT, the long prompt's TTFT, and the longest gap the streaming
                 request saw while the long prompt was prefilled.
                 Compare `--max-num-batched-tokens 256` (chunked prefill) with a budget larger than the prompt
                 (the whole prompt in one step, as without chunked prefill).
  shared-prefix: requests that share a long prefix (a system prompt) with different endings, one at a time.
                 Reports the TTFT of each after the first. Compare the default with `--no-prefix-caching`.

    python benchmarks/bench_scheduler.py long-prompt --url http://127.0.0.1:8000 --prompt-tokens 1000
"""
import argparse
import asyncio
import json
import random
import statistics
import time

import httpx

VOCAB_LOW, VOCAB_HIGH = 1000, 40000  # plain word pieces, away from special tokens


def token_prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]


async def stream_completion(client, url, model, prompt, max_tokens, times: list[float]) -> float:
    """Streams one completion, appending each chunk's arrival time to `times`; returns the TTFT."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"]:
                times.append(time.perf_counter())
    return (times[0] if times else time.perf_counter()) - start


async def long_prompt_round(client, url, model, prompt_tokens: int, seed: int) -> dict:
    streaming_times: list[float] = []
    streamer = asyncio.create_task(stream_completion(client, url, model, token_prompt(16, seed), 48, streaming_times))
    while len(streaming_times) < 3:
        await asyncio.sleep(0.01)
    long_start = time.perf_counter()
    long_req = asyncio.create_task(stream_completion(client, url, model, token_prompt(prompt_tokens, seed + 1), 1, []))
    await asyncio.sleep(0.05)
    short_ttft = await stream_completion(client, url, model, token_prompt(8, seed + 2), 1, [])
    long_ttft = await long_req
    await streamer
    during = [t for t in streaming_times if t >= long_start]
    gaps = [b - a for a, b in zip([long_start] + during, during)]
    return {"short_ttft": short_ttft, "long_ttft": long_ttft, "max_stream_gap": max(gaps, default=float("nan"))}


async def shared_prefix_round(client, url, model, prompt_tokens: int, requests: int, seed: int) -> list[float]:
    prefix = token_prompt(prompt_tokens, seed)
    return [await stream_completion(client, url, model, prefix + token_prompt(12, seed + 100 + i), 1, [])
            for i in range(requests)]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=["long-prompt", "shared-prefix"])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--label", default="", help="a name for this server configuration in the table")
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    async with httpx.AsyncClient(timeout=None) as client:
        model = (await client.get(f"{args.url}/v1/models")).json()["data"][0]["id"]
        if args.scenario == "long-prompt":
            await long_prompt_round(client, args.url, model, args.prompt_tokens, seed=999)  # warm-up: compiles buckets
            runs = [await long_prompt_round(client, args.url, model, args.prompt_tokens, seed=i * 10) for i in range(args.repeats)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"| {args.label} | {med['short_ttft']:.2f} | {med['long_ttft']:.2f} | {med['max_stream_gap']:.2f} |")
        else:
            await shared_prefix_round(client, args.url, model, 32, 2, seed=999)  # warm-up
            ttfts = await shared_prefix_round(client, args.url, model, args.prompt_tokens, args.repeats + 1, seed=1)
            print(f"| {args.label} | {ttfts[0]:.2f} | {statistics.median(ttfts[1:]):.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
