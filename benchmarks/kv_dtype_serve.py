"""What each KV cache dtype buys through the HTTP server: the blocks one budget holds, the 2048-token sequences they
fit, and output tokens/s at concurrency 16 (`tinyvllm bench serve`), one server per dtype, on this machine.

    .venv/bin/python benchmarks/kv_dtype_serve.py [--dtypes float32 float16 int8] [--kv-cache-memory 1G]
        [--num-prompts 64] [--input-len 256] [--output-len 64] [--repeats 1]

Each server: `serve --kv-cache-dtype D --kv-cache-memory M` (jitted steps captured at start), its block count read
from /metrics (vllm:cache_config_info), then a concurrency-16 level of random prompts with ignore_eos after a warm-up.
DEV=CPU unless DEV is set. With --repeats R the tokens/s column is the median of R servers.
"""
import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.kv_disk_ttft import start_bench_server  # noqa: E402

SEQUENCE_TOKENS = 2048


def num_blocks(url: str) -> tuple[int, int]:
    text = httpx.get(url + "/metrics", timeout=30).text
    m = re.search(r'^vllm:cache_config_info\{([^}]*)\}', text, re.MULTILINE)
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    return int(labels["num_gpu_blocks"]), int(labels["block_size"])


def output_throughput(url: str, args, out: pathlib.Path) -> float:
    subprocess.run([sys.executable, "-m", "tinyvllm.frontend.cli.main", "bench", "serve", "--base-url", url,
                    "--num-prompts", str(args.num_prompts), "--random-input-len", str(args.input_len),
                    "--random-output-len", str(args.output_len), "--ignore-eos", "--max-concurrency", "16",
                    "--warmup", "4", "--disable-tqdm", "--json", str(out)], check=True, cwd=REPO,
                   stdout=subprocess.DEVNULL)
    (record,) = json.loads(out.read_text())["results"]
    assert record["failed"] == 0, record["errors"]
    return record["output_throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16", "int8"])
    parser.add_argument("--kv-cache-memory", default="1G")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    rows, work = [], pathlib.Path(tempfile.mkdtemp(prefix="kv-dtype-bench-"))
    for dtype in args.dtypes:
        rates = []
        for repeat in range(args.repeats):
            server = start_bench_server(work / f"{dtype}-{repeat}.log", "--warmup-before-serving",
                                        "--kv-cache-dtype", dtype, "--kv-cache-memory", args.kv_cache_memory)
            try:
                blocks, block_size = num_blocks(server.url)
                rates.append(output_throughput(server.url, args, work / f"{dtype}-{repeat}.json"))
            finally:
                server.stop()
        rows.append((dtype, blocks, blocks * block_size // SEQUENCE_TOKENS, statistics.median(rates)))
    base = rows[0][3]
    print(f"| KV dtype | blocks in {args.kv_cache_memory} | {SEQUENCE_TOKENS}-token sequences that fit | "
          f"output tok/s at concurrency 16 | vs {rows[0][0]} |")
    print("|---|---:|---:|---:|---:|")
    for dtype, blocks, sequences, rate in rows:
        print(f"| {dtype} | {blocks} | {sequences} | {rate:.1f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
