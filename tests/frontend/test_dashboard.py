"""/dashboard: the snapshot's JSON (counts, KV blocks, batch, history, replicas), the event stream and its bound, and
the API-key guard (Bearer header, ?key= and the cookie it sets). tests/e2e/test_dashboard.py drives the page in a
real browser."""
import json
import time

import httpx
import pytest

from app_harness import MAX_MODEL_LEN, MODEL, REPLY, client_for, make_app
from fake_engine import FakeEngine
from fake_tokenizer import CharDetokenizer, CharTokenizer
from threaded_server import served
from tinyvllm.frontend.api.app import build_app
from tinyvllm.frontend.api import dashboard
from tinyvllm.frontend.api.dashboard_snapshot import HISTORY_POINTS, DashboardHistory
from tinyvllm.protocol.batch_summary import RunningRequestSummary
from tinyvllm.protocol.messages import SchedulerStats

pytestmark = pytest.mark.anyio
KEY = "sk-dash-Ünï"


def busy_stats(running: int = 2) -> SchedulerStats:
    return SchedulerStats(num_running=running, num_waiting=3, num_free_blocks=60, num_total_blocks=100,
                          prefix_cache_queries=200, prefix_cache_hits=50, num_preemptions=4, num_cached_free_blocks=15,
                          running_requests=[RunningRequestSummary("cmpl-a", 12, 7, 2),
                                            RunningRequestSummary("chatcmpl-b", 30, 1, 3)])


def keyed_app():
    tokenizer = CharTokenizer()
    engine = FakeEngine(tokenizer.encode(REPLY, add_special_tokens=False), tokenizer.eos_token_ids[0],
                        max_model_len=MAX_MODEL_LEN)
    return build_app(engine, tokenizer, MODEL, MAX_MODEL_LEN, make_detokenizer=CharDetokenizer, api_key=KEY), engine


async def test_the_snapshot_reports_counts_blocks_cache_and_batch():
    app, engine, _ = make_app()
    engine.stats = busy_stats()
    body = (await client_for(app).get("/dashboard/snapshot")).json()
    assert body["model"] and body["engine_dead"] is None
    assert (body["running"], body["waiting"], body["preemptions"]) == (2, 3, 4)
    assert body["kv_blocks"] == {"used": 40, "cached": 15, "free": 45, "total": 100}
    assert body["prefix_cache"] == {"queries": 200, "hits": 50, "hit_rate": 0.25}
    assert body["batch"] == [{"id": "cmpl-a", "prompt_tokens": 12, "generated_tokens": 7, "blocks": 2},
                             {"id": "chatcmpl-b", "prompt_tokens": 30, "generated_tokens": 1, "blocks": 3}]
    assert body["batch_truncated"] is False and body["replicas"] == []
    assert set(body["history"]) == {"time", "tokens_per_s", "ttft_s"}

    engine.stats = busy_stats(running=100)  # the scheduler summarizes a bounded part of a large batch
    assert (await client_for(app).get("/dashboard/snapshot")).json()["batch_truncated"] is True


async def test_several_replicas_get_a_panel_each():
    app, engine, _ = make_app()
    engine.stats = busy_stats()
    engine.stats_by_engine = lambda: {"0": busy_stats(), "1": SchedulerStats(num_free_blocks=100, num_total_blocks=100)}
    replicas = (await client_for(app).get("/dashboard/snapshot")).json()["replicas"]
    assert [r["engine"] for r in replicas] == ["0", "1"]
    assert replicas[0]["running"] == 2 and len(replicas[0]["batch"]) == 2
    assert replicas[1]["kv_blocks"] == {"used": 0, "cached": 0, "free": 100, "total": 100}
    assert replicas[1]["prefix_cache"]["hit_rate"] is None


async def test_requests_feed_the_token_and_ttft_totals():
    app, _, _ = make_app()
    client = client_for(app)
    r = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 5})
    assert r.status_code == 200
    metrics = app.state.metrics
    assert metrics.streamed_tokens == r.json()["usage"]["completion_tokens"] and metrics.first_token_count == 1


def test_the_history_keeps_rates_per_interval_and_is_bounded():
    class Totals:
        streamed_tokens, first_token_seconds_sum, first_token_count = 0, 0.0, 0

    now = [100.0]
    history = DashboardHistory(Totals, clock=lambda: now[0], wall_clock=lambda: now[0])
    history.sample()  # the baseline
    Totals.streamed_tokens, Totals.first_token_seconds_sum, Totals.first_token_count = 40, 0.6, 2
    now[0] += 0.5
    history.sample()  # too soon: no point yet
    now[0] += 1.5
    history.sample()
    assert history.series() == {"time": [102.0], "tokens_per_s": [20.0], "ttft_s": [0.3]}
    for _ in range(HISTORY_POINTS + 10):
        now[0] += 1
        history.sample()
    series = history.series()
    assert len(series["time"]) == HISTORY_POINTS and series["ttft_s"][-1] is None and series["tokens_per_s"][-1] == 0


async def test_the_page_ships_inline():
    r = await client_for(make_app()[0]).get("/dashboard")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'id="running"' in r.text and "EventSource" in r.text
    assert "http://" not in r.text and "https://" not in r.text and "<script src" not in r.text


def first_event(client: httpx.Client, **kwargs) -> tuple[int, dict | None]:
    with client.stream("GET", "/dashboard/events", **kwargs) as r:
        if r.status_code != 200:
            return r.status_code, None
        assert r.headers["content-type"].startswith("text/event-stream")
        line = next(line for line in r.iter_lines() if line)
        return 200, json.loads(line.removeprefix("data: "))


def test_the_event_stream_sends_snapshots_and_is_bounded(monkeypatch):
    monkeypatch.setattr(dashboard, "MAX_EVENT_STREAMS", 1)
    app, engine, _ = make_app()
    engine.stats = busy_stats()
    with served(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        with client.stream("GET", "/dashboard/events") as held:
            assert held.status_code == 200
            status, _ = first_event(client)
            assert status == 503  # the one stream allowed is taken
        deadline = time.monotonic() + 5
        while (status := first_event(client))[0] == 503:  # the slot comes back once the server saw it close
            assert time.monotonic() < deadline, "the closed stream kept its slot"
            time.sleep(0.05)
        assert status[0] == 200 and status[1]["running"] == 2


def test_the_api_key_guards_every_dashboard_route():
    app, _ = keyed_app()
    with served(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        for path in ("/dashboard", "/dashboard/snapshot", "/dashboard/events"):
            for params in ({}, {"key": "wrong"}):
                r = client.get(path, params=params)
                assert r.status_code == 401 and r.json()["error"]["code"] == 401, (path, params)
        assert client.get("/dashboard/snapshot", headers={"Authorization": f"Bearer {KEY}".encode()}).status_code == 200
        assert client.get("/dashboard/snapshot", params={"key": KEY}).status_code == 200
        with httpx.Client(base_url=url, timeout=10, cookies={dashboard.COOKIE_NAME: "forged"}) as forger:
            assert forger.get("/dashboard/snapshot").status_code == 401
        odd = {"Cookie": f"{dashboard.COOKIE_NAME}=\u00e9\u6f22".encode("utf-8")}  # non-ASCII: a 401, not a 500
        assert client.get("/dashboard/snapshot", headers=odd).status_code == 401

        page = client.get("/dashboard", params={"key": KEY})  # how a browser opens it
        assert page.status_code == 200
        cookie = page.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard" in cookie
        assert KEY not in cookie and "sk-dash" not in cookie  # an HMAC of the key, not the key
        assert client.cookies.get(dashboard.COOKIE_NAME)
        assert client.get("/dashboard/snapshot").status_code == 200  # the cookie alone
        assert first_event(client)[0] == 200  # what the page's EventSource sends
        assert client.get("/v1/models").status_code == 401  # the cookie opens /dashboard only
