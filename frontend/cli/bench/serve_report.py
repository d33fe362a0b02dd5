"""Statistics over one concurrency level's requests, a markdown table of all levels, and the JSON record.

Metric names follow `vllm bench serve --save-result` (mean_ttft_ms, p99_itl_ms, output_throughput, ...), so
the same scripts can read both. Percentiles interpolate linearly between samples (numpy's default, as vLLM).
TPOT = (E2E - TTFT) / (output tokens - 1), over the requests with more than one output token; ITL pools every
gap between content chunks of every successful request. Times in the table and the JSON are milliseconds.
"""
from __future__ import annotations

import math

import numpy as np

from tinyvllm.frontend.cli.bench.serve_client import RequestResult

METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E"))


def distribution(values_s: list[float]) -> dict[str, float | None]:
    """mean, median, std, p50, p90, p99 in milliseconds of values in seconds; None each when there are none."""
    if not values_s:
        return {k: None for k in ("mean", "median", "std", "p50", "p90", "p99")}
    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"mean": float(ms.mean()), "median": float(p50), "std": float(ms.std()), "p50": float(p50),
            "p90": float(p90), "p99": float(p99)}


def summarize(results: list[RequestResult], duration_s: float, max_concurrency: int | None = None,
              request_rate: float = math.inf) -> dict:
    """One level's record: counts, throughputs, latency distributions, and the per-request samples."""
    ok = [r for r in results if r.success]
    samples = {"ttft": [r.ttft for r in ok], "tpot": [r.tpot for r in ok if r.tpot is not None],
               "itl": [gap for r in ok for gap in r.itl], "e2el": [r.latency for r in ok]}
    total_in, total_out = sum(r.prompt_len for r in ok), sum(r.output_tokens for r in ok)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    record = {"max_concurrency": max_concurrency, "request_rate": None if math.isinf(request_rate) else request_rate,
              "num_prompts": len(results), "completed": len(ok), "failed": len(results) - len(ok),
              "duration": duration_s, "total_input_tokens": total_in, "total_output_tokens": total_out,
              "request_throughput": per_s(len(ok)), "output_throughput": per_s(total_out),
              "total_token_throughput": per_s(total_in + total_out)}
    for key, _ in METRICS:
        for stat, value in distribution(samples[key]).items():
            record[f"{stat}_{key}_ms"] = value
    record.update({"input_lens": [r.prompt_len for r in results], "output_lens": [r.output_tokens for r in results],
                   "ttfts": [r.ttft for r in results], "itls": [r.itl for r in results],
                   "e2els": [r.latency for r in results], "errors": [r.error for r in results]})
    return record


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown_table(records: list[dict]) -> str:
    """One row per level; requests counts all sent (failed ones too), the rates count only successful ones;
    each latency cell is 'mean / p50 / p99' in milliseconds."""
    head = ["concurrency", "requests", "failed", "duration (s)", "req/s", "output tok/s", "total tok/s"]
    head += [f"{label} ms mean / p50 / p99" for _, label in METRICS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        row = [str(r["max_concurrency"] or "unlimited"), str(r["num_prompts"]), str(r["failed"]),
               f"{r['duration']:.2f}", f"{r['request_throughput']:.2f}", f"{r['output_throughput']:.2f}",
               f"{r['total_token_throughput']:.2f}"]
        row += [" / ".join(_ms(r[f"{s}_{key}_ms"]) for s in ("mean", "p50", "p99")) for key, _ in METRICS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def error_summary(records: list[dict], limit: int = 5) -> list[str]:
    """The most frequent distinct error messages over all levels, with their counts."""
    counts: dict[str, int] = {}
    for record in records:
        for error in record["errors"]:
            if error:
                counts[error] = counts.get(error, 0) + 1
    return [f"{n}x {e}" for e, n in sorted(counts.items(), key=lambda kv: -kv[1])[:limit]]
