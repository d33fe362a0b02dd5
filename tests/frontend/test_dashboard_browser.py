"""/dashboard in headless chromium against the app on a fake engine with an API key: opened as /dashboard?key=...,
the page's event stream gets in with the cookie alone, the key leaves the address bar, and with two replicas each
gets a panel. (tests/e2e/test_dashboard.py watches a real server's batch.)"""
import json

from test_dashboard import KEY, busy_stats, keyed_app
from tests.e2e.headless_chromium import HeadlessChromium
from tests.e2e.server_process import wait_until
from threaded_server import served
from tinyvllm.protocol.messages import SchedulerStats

PAGE_STATE = """JSON.stringify({
  href: location.href, status: document.getElementById("status").textContent,
  running: document.getElementById("running").textContent,
  replicas: [...document.querySelectorAll("#replicas .replica")].map((panel) => ({
    title: panel.querySelector("h3").textContent, counts: panel.querySelector(".counts").textContent,
    rows: panel.querySelectorAll("tbody tr").length}))})"""


def test_the_page_streams_with_the_key_cookie_and_shows_each_replica(tmp_path):
    app, engine = keyed_app()
    engine.stats = busy_stats()
    engine.stats_by_engine = lambda: {"0": busy_stats(), "1": SchedulerStats(num_free_blocks=100, num_total_blocks=100)}
    with served(app) as url, HeadlessChromium(tmp_path / "chromium") as browser:
        browser.open(f"{url}/dashboard?key={KEY}")

        def page():
            return json.loads(browser.evaluate(PAGE_STATE))

        assert wait_until(lambda: page()["running"] == "2", 20), page()
        state = page()
        assert state["status"] == "live" and state["href"] == f"{url}/dashboard", state
        assert [r["title"] for r in state["replicas"]] == ["engine 0", "engine 1"], state
        assert state["replicas"][0]["rows"] == 2 and state["replicas"][1]["rows"] == 0
        assert "running 2 · waiting 3" in state["replicas"][0]["counts"]
        browser.screenshot(tmp_path / "dashboard-replicas.png")
