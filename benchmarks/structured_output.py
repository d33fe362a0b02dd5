"""What a JSON schema costs: output tokens/s with and without one, at each concurrency, through one server.

    .venv/bin/python benchmarks/structured_output.py [--model PATH] [--concurrency 1 16] [--output-len 32]
        [--rounds 1] [-- extra serve args]

Both kinds of request produce exactly --output-len tokens: the plain ones with ignore_eos, the constrained ones
with a schema whose one string needs more characters than that (so the grammar never ends first). Each level runs
two warm-up waves of each kind first (they compile the forward buckets and sampler variants both kinds use), then
--rounds pairs of waves of `concurrency` requests at once, plain and constrained alternating; tokens/s is a wave's
output tokens over its wall time, the median over the rounds. DEV=CPU unless DEV is set.
"""
import argparse
import pathlib
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.kv_disk_ttft import Server  # noqa: E402

SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 2000, "maxLength": 4000}},
          "required": ["story"], "additionalProperties": False}


def one_request(url: str, i: int, output_len: int, constrained: bool) -> int:
    body = {"prompt": f"Story {i}: once upon a time", "max_tokens": output_len, "temperature": 1.0, "seed": i}
    body |= {"guided_json": SCHEMA} if constrained else {"ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=1800, trust_env=False)
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


def wave(url: str, concurrency: int, output_len: int, constrained: bool) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(lambda i: one_request(url, i, output_len, constrained), range(concurrency)))
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    args, serve_args = parser.parse_known_args()
    serve_args = [a for a in serve_args if a != "--"] + (["--model", args.model] if args.model else [])
    log = pathlib.Path(tempfile.mkdtemp()) / "server.log"
    server = Server(log, *serve_args)
    try:
        print("| concurrency | plain tok/s | JSON schema tok/s | ratio |\n|---|---|---|---|")
        for c in args.concurrency:
            for constrained in (False, True, False, True):
                wave(server.url, c, args.output_len, constrained)  # warm-up
            runs = {False: [], True: []}
            for _ in range(args.rounds):
                for constrained in (False, True):
                    runs[constrained].append(wave(server.url, c, args.output_len, constrained))
            rates = {k: statistics.median(v) for k, v in runs.items()}
            print(f"| {c} | {rates[False]:.1f} | {rates[True]:.1f} | {rates[True] / rates[False]:.2f} |", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
