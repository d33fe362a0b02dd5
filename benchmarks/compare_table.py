"""Print one markdown table comparing servers from their `tinyvllm bench serve --json` (or `vllm bench serve
--save-result`) files: a row per server, output tok/s at each concurrency and TTFT p50 at the highest one, then
ratio rows "tinyvllm / <peer>".

    python benchmarks/compare_table.py tinyvllm=out/tinyvllm.json vllm=out/vllm-c1.json vllm=out/vllm-c4.json ...

A server may be named several times (one file per concurrency level); a file may hold one level's record,
a list of them, or {"results": [...]}. Missing servers, files or levels print as "-".
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

# Key names in the JSON records: the first one present wins, so both tinyvllm's and vLLM's names work.
RESULTS_KEYS = ("results",)                                   # where a file keeps its list of per-level records
CONCURRENCY_KEYS = ("max_concurrency", "concurrency")
THROUGHPUT_KEYS = ("output_throughput", "output_tok_s")       # output tokens/s, all requests of the level
TTFT_P50_KEYS = ("p50_ttft_ms", "median_ttft_ms", "ttft_p50_ms")  # milliseconds
TTFT_P50_SECONDS_KEYS = ("ttft_p50_s",)                        # seconds (converted to ms)

SERVER_ORDER = ("tinyvllm", "vllm", "llama-server")
LABELS = {"tinyvllm": "tinyvllm", "vllm": "vLLM", "llama-server": "llama-server"}
REFERENCE = "tinyvllm"  # the ratio rows divide this server's numbers by each peer's


def first(record: dict, keys: tuple[str, ...]):
    for key in keys:
        if record.get(key) is not None:
            return record[key]
    return None


def records_of(data) -> list[dict]:
    if isinstance(data, list):
        return [r for r in data if isinstance(r, dict)]
    if isinstance(data, dict):
        for key in RESULTS_KEYS:
            if isinstance(data.get(key), list):
                return records_of(data[key])
        return [data]
    return []


def load(specs: list[str]) -> dict[str, dict[int, dict]]:
    """{server: {concurrency: {"tput": tok/s, "ttft_p50_ms": ms}}} from NAME=PATH arguments."""
    servers: dict[str, dict[int, dict]] = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        levels = servers.setdefault(name, {})
        try:
            data = json.loads(pathlib.Path(path).read_text())
        except (OSError, ValueError) as e:
            print(f"warning: {name}: {path}: {e}", file=sys.stderr)
            continue
        for record in records_of(data):
            concurrency = first(record, CONCURRENCY_KEYS)
            ttft = first(record, TTFT_P50_KEYS)
            if ttft is None and first(record, TTFT_P50_SECONDS_KEYS) is not None:
                ttft = 1000.0 * first(record, TTFT_P50_SECONDS_KEYS)
            levels[int(concurrency) if concurrency else 0] = {"tput": first(record, THROUGHPUT_KEYS),
                                                              "ttft_p50_ms": ttft}
    return servers


def table(servers: dict[str, dict[int, dict]], concurrencies: list[int]) -> str:
    top = max(concurrencies)
    head = ["server"] + [f"output tok/s @{c}" for c in concurrencies] + [f"TTFT p50 ms @{top}"]

    def values(name: str) -> list:
        levels = servers.get(name, {})
        return [levels.get(c, {}).get("tput") for c in concurrencies] + [levels.get(top, {}).get("ttft_p50_ms")]

    def cell(v, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    names = [s for s in SERVER_ORDER if s in servers] + [s for s in servers if s not in SERVER_ORDER]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        lines.append("| " + " | ".join([LABELS.get(name, name)] + [cell(v, ".1f") for v in values(name)]) + " |")
    if REFERENCE in servers:
        ours = values(REFERENCE)
        for peer in names:
            if peer == REFERENCE:
                continue
            ratios = [None if a is None or not b else a / b for a, b in zip(ours, values(peer))]
            label = f"{LABELS.get(REFERENCE, REFERENCE)} / {LABELS.get(peer, peer)}"
            lines.append("| " + " | ".join([label] + [cell(r, ".2f") + ("x" if r is not None else "")
                                                      for r in ratios]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", metavar="NAME=PATH", help="a server's name and one of its JSON files")
    ap.add_argument("--concurrency", default=None, metavar='"1 4 16"',
                    help="the columns, comma- or space-separated (default: every level found in the files)")
    args = ap.parse_args()
    servers = load(args.files)
    concurrencies = [int(c) for c in (args.concurrency or "").replace(",", " ").split()] or sorted({c for levels in servers.values() for c in levels}) or [1]
    print(table(servers, concurrencies))


if __name__ == "__main__":
    main()
