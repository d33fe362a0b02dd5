"""Rerank throughput against the embeddings path on the same server: documents per second for one /v1/rerank call
of N documents and for one /v1/embeddings call of the same N texts (the reranker's query + document pairs).

    .venv/bin/python benchmarks/rerank_throughput.py [--documents 32] [--words 60] [--repeats 5] [--model M] [ARGS...]

A `tinyvllm serve` (serve's defaults plus ARGS, its jitted steps captured at start) on the default model unless
--model; DEV=CPU unless DEV is set. Each repeat sends the rerank call, then the embeddings call, with documents of
--words random words (another set each repeat, so no repeat hits the prefix cache beyond the rerank prompt's shared
beginning). Prints a table of medians; the first repeat (compiling the score head's variants) is not counted.
"""
import argparse
import pathlib
import random
import statistics
import sys
import tempfile
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.kv_disk_ttft import start_bench_server  # noqa: E402

WORDS = ("river stone market light engine garden paper window silver music winter forest number answer city "
         "capital france paris history science letter energy travel harbor island").split()


def timed_post(url: str, body: dict) -> tuple[float, dict]:
    start = time.perf_counter()
    response = httpx.post(url, json=body, timeout=900, trust_env=False)
    response.raise_for_status()
    return time.perf_counter() - start, response.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=32)
    parser.add_argument("--words", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default=None)
    args, serve_args = parser.parse_known_args()
    rng = random.Random(0)
    query = "Which passage is about the capital of France?"
    with tempfile.TemporaryDirectory() as folder:
        server = start_bench_server(pathlib.Path(folder) / "server.log", *serve_args, model=args.model)
        try:
            times = {"rerank": [], "embeddings": []}
            tokens = {}
            for repeat in range(args.repeats + 1):
                documents = [" ".join(rng.choice(WORDS) for _ in range(args.words)) for _ in range(args.documents)]
                seconds, body = timed_post(server.url + "/v1/rerank", {"query": query, "documents": documents})
                tokens["rerank"] = body["usage"]["total_tokens"]
                texts = [f"{query}\n{d}" for d in documents]
                seconds_e, body_e = timed_post(server.url + "/v1/embeddings", {"input": texts})
                tokens["embeddings"] = body_e["usage"]["total_tokens"]
                if repeat:
                    times["rerank"].append(seconds)
                    times["embeddings"].append(seconds_e)
        finally:
            server.stop()
    print(f"| path | documents | tokens per call | median s | documents/s | tokens/s |\n|---|---|---|---|---|---|")
    for path, runs in times.items():
        median = statistics.median(runs)
        print(f"| {path} | {args.documents} | {tokens[path]} | {median:.2f} | {args.documents / median:.1f} | "
              f"{tokens[path] / median:.0f} |")


if __name__ == "__main__":
    main()
