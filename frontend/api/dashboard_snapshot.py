"""/dashboard's JSON snapshot: the engines' latest stats (summed, and per replica when there are several) and the
last few minutes of tokens/s and time to first token.

Bounded: each engine's batch holds at most MAX_SUMMARIZED_REQUESTS requests (the scheduler sends no more), the summed
view too, and the history HISTORY_POINTS points.
"""
import time
from collections import deque

from tinyvllm.protocol.batch_summary import MAX_SUMMARIZED_REQUESTS
from tinyvllm.protocol.messages import SchedulerStats

SAMPLE_INTERVAL_S = 1.0
HISTORY_POINTS = 300  # five minutes at one point a second


class DashboardHistory:
    """Tokens/s and mean TTFT per interval, from FrontendMetrics' running totals.

    Sampled when a snapshot is taken, so no task runs while nobody watches; a point then covers the whole gap since
    the previous one (its average)."""

    def __init__(self, metrics, clock=time.monotonic, wall_clock=time.time):
        self.metrics, self.clock, self.wall_clock = metrics, clock, wall_clock
        self.points: deque[tuple[float, float, float | None]] = deque(maxlen=HISTORY_POINTS)
        self._last: tuple[float, int, float, int] | None = None  # time, tokens, TTFT sum, TTFT count

    def _totals(self) -> tuple[float, int, float, int]:
        m = self.metrics
        return self.clock(), m.streamed_tokens, m.first_token_seconds_sum, m.first_token_count

    def sample(self) -> None:
        now = self._totals()
        if self._last is None:
            self._last = now
            return
        elapsed = now[0] - self._last[0]
        if elapsed < SAMPLE_INTERVAL_S:
            return
        tokens, ttft_sum, ttft_count = (now[i] - self._last[i] for i in (1, 2, 3))
        mean_ttft = ttft_sum / ttft_count if ttft_count else None  # None: no request started in the interval
        self.points.append((round(self.wall_clock(), 3), round(tokens / elapsed, 2),
                            None if mean_ttft is None else round(mean_ttft, 4)))
        self._last = now

    def series(self) -> dict:
        return {"time": [p[0] for p in self.points], "tokens_per_s": [p[1] for p in self.points],
                "ttft_s": [p[2] for p in self.points]}


def engine_panel(stats: SchedulerStats) -> dict:
    """One engine's (or the sum's) counts, KV blocks, cache and batch."""
    total, free = stats.num_total_blocks, stats.num_free_blocks
    cached = min(stats.num_cached_free_blocks, free)
    queries, hits = stats.prefix_cache_queries, stats.prefix_cache_hits
    batch = [{"id": r.req_id, "prompt_tokens": r.num_prompt_tokens, "generated_tokens": r.num_output_tokens,
              "blocks": r.num_blocks} for r in stats.running_requests[:MAX_SUMMARIZED_REQUESTS]]
    return {
        "running": stats.num_running, "waiting": stats.num_waiting,
        # used: held by requests; cached: free but still holding prefix-cache content; free: empty
        "kv_blocks": {"used": total - free, "cached": cached, "free": free - cached, "total": total},
        "preemptions": stats.num_preemptions,
        "prefix_cache": {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else None},
        "batch": batch, "batch_truncated": stats.num_running > len(batch),
    }


def snapshot(engine, history: DashboardHistory, model_name: str) -> dict:
    history.sample()
    by_engine = engine.stats_by_engine() if hasattr(engine, "stats_by_engine") else {"0": engine.stats}
    replicas = [{"engine": name, **engine_panel(stats)} for name, stats in by_engine.items()] \
        if len(by_engine) > 1 else []
    return {"model": model_name, "time": round(time.time(), 3), "engine_dead": engine.dead_reason,
            **engine_panel(engine.stats), "replicas": replicas, "history": history.series()}
