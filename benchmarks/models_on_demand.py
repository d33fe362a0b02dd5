"""Models on demand (`tinyvllm serve --models-dir DIR`, no --model): seconds from a request for a model that is not
loaded to its first token, for a cold model (empty tinygrad and tinyvllm caches: a fresh machine), one unloaded
before (its captured steps and packed weights in the caches), and one that first has to make room by unloading
another (--max-loaded-models 1), against the same request to the loaded model.

    .venv/bin/python benchmarks/models_on_demand.py [--model FILE.gguf] [--repeats 3] [-- extra serve flags]

Prints a markdown table of medians (seconds to the first streamed token of a 1-token chat answer).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.e2e.server_process import free_port  # noqa: E402
from tinyvllm.protocol.model_path import resolve_model_path  # noqa: E402


def time_to_first_token(url: str, model: str) -> float:
    start = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=900, json={
            "model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                return time.monotonic() - start
    raise RuntimeError("no token came")


def unload(url: str, model: str) -> None:
    httpx.post(f"{url}/models/unload", json={"model": model}, timeout=60)
    while any(m["name"].startswith(model) for m in httpx.get(f"{url}/api/ps").json()["models"]):
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a GGUF file or model folder (default: the default model)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("serve_flags", nargs="*")
    args = parser.parse_args()
    weights = str(resolve_model_path(args.model))
    rows: dict[str, list[float]] = {"cold: a fresh machine's first request": [],
                                    "loaded: the same request to the loaded model": [],
                                    "reloaded: unloaded before (captured steps on disk)": [],
                                    "evicting: another model unloaded first (--max-loaded-models 1)": []}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "DEV": os.environ.get("DEV", "CPU"), "XDG_CACHE_HOME": cache,
                   "CACHEDB": os.path.join(cache, "tinygrad.db")}
            port, store = free_port(), os.path.join(cache, "models")
            proc = subprocess.Popen([sys.executable, "-m", "tinyvllm.frontend.cli.main", "serve", "--port", str(port),
                                     "--models-dir", store, "--max-loaded-models", "1", *args.serve_flags], env=env,
                                    stdout=subprocess.DEVNULL, stderr=open(os.path.join(cache, "serve.log"), "w"),
                                    start_new_session=True)
            url = f"http://127.0.0.1:{port}"
            try:
                while True:
                    try:
                        if httpx.get(f"{url}/health").status_code == 200:
                            break
                    except httpx.TransportError:
                        time.sleep(0.1)
                for name in ("first", "second"):
                    httpx.post(f"{url}/api/create", json={"model": name, "from": weights, "stream": False},
                               timeout=60).raise_for_status()
                rows["cold: a fresh machine's first request"].append(time_to_first_token(url, "first"))
                rows["loaded: the same request to the loaded model"].append(time_to_first_token(url, "first"))
                unload(url, "first")
                rows["reloaded: unloaded before (captured steps on disk)"].append(time_to_first_token(url, "first"))
                time_to_first_token(url, "second")  # warms the second model's caches (the same weights)
                rows["evicting: another model unloaded first (--max-loaded-models 1)"].append(
                    time_to_first_token(url, "first"))
            finally:
                proc.terminate()
                proc.wait(60)
    print(f"| {os.path.basename(weights)} | s to the first token (median of {args.repeats}) |\n|---|---|")
    for label, values in rows.items():
        print(f"| {label} | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
