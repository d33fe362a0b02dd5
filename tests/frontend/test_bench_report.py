"""frontend/cli/bench/serve_report.py: percentiles, TPOT, throughputs and the table, on known inputs."""
import math

import pytest

from tinyvllm.frontend.cli.bench.serve_client import RequestResult
from tinyvllm.frontend.cli.bench.serve_report import distribution, error_summary, markdown_table, summarize


def test_distribution_is_in_milliseconds_with_linear_percentiles():
    d = distribution([0.001, 0.002, 0.003, 0.004, 0.010])
    assert d["mean"] == pytest.approx(4.0)
    assert d["median"] == d["p50"] == pytest.approx(3.0)
    assert d["p90"] == pytest.approx(7.6)  # between 4 and 10 at rank 3.6
    assert d["p99"] == pytest.approx(9.76)
    assert d["std"] == pytest.approx(math.sqrt((9 + 4 + 1 + 0 + 36) / 5))
    assert distribution([0.5]) == {"mean": 500.0, "median": 500.0, "std": 0.0, "p50": 500.0, "p90": 500.0, "p99": 500.0}
    assert set(distribution([]).values()) == {None}


def ok(prompt_len, ttft, itl, latency, out):
    return RequestResult(prompt_len, True, "", ttft, itl, latency, out)


def test_tpot_excludes_the_first_token_and_single_token_outputs():
    assert ok(4, 0.5, [0.1, 0.1, 0.1], 0.8, 4).tpot == pytest.approx(0.1)
    assert ok(4, 0.5, [], 0.5, 1).tpot is None


def test_summarize_counts_only_successful_requests_in_rates_and_latencies():
    results = [ok(10, 0.1, [0.02, 0.04], 0.16, 3), ok(10, 0.3, [0.02], 0.32, 2),
               RequestResult(10, False, "HTTP 500: boom"), ok(10, 0.2, [], 0.2, 1)]
    r = summarize(results, duration_s=2.0, max_concurrency=4)
    assert (r["num_prompts"], r["completed"], r["failed"]) == (4, 3, 1)
    assert (r["total_input_tokens"], r["total_output_tokens"]) == (30, 6)
    assert r["request_throughput"] == pytest.approx(1.5)
    assert r["output_throughput"] == pytest.approx(3.0)
    assert r["total_token_throughput"] == pytest.approx(18.0)
    assert r["mean_ttft_ms"] == pytest.approx(200.0) and r["median_ttft_ms"] == pytest.approx(200.0)
    assert r["mean_itl_ms"] == pytest.approx(80 / 3)  # every gap of every request, pooled
    assert r["mean_tpot_ms"] == pytest.approx(25.0)  # (0.06/2 + 0.02/1) / 2; the 1-token request has none
    assert r["mean_e2el_ms"] == pytest.approx(680 / 3)
    assert r["max_concurrency"] == 4 and r["request_rate"] is None
    assert r["errors"] == ["", "", "HTTP 500: boom", ""] and len(r["itls"]) == 4


def test_table_has_one_row_per_level_and_dashes_for_missing_latencies():
    levels = [summarize([ok(8, 0.1, [0.01], 0.11, 2)], 1.0, 1),
              summarize([RequestResult(8, False, "refused")], 1.0, None, request_rate=2.0)]
    lines = markdown_table(levels).splitlines()
    assert len(lines) == 4 and lines[0].startswith("| concurrency | requests | failed |")
    assert lines[2].startswith("| 1 | 1 | 0 | 1.00 | 1.00 | 2.00 | 10.00 | 100.0 / 100.0 / 100.0 |")
    assert lines[3].startswith("| unlimited | 1 | 1 |") and "- / - / -" in lines[3]
    assert levels[1]["request_rate"] == 2.0
    assert error_summary(levels) == ["1x refused"]
