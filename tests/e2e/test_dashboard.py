"""/dashboard in a real headless browser (chromium over the DevTools protocol): while 4 streams run against the
real server the page shows 4 running requests, their batch rows and a non-zero KV bar; once the clients close
them (the server aborts them), 0 and no used blocks. A screenshot of the busy page lands in the test's folder."""
import json
import threading

import httpx
import pytest

from tests.e2e.headless_chromium import HeadlessChromium
from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S, wait_until
from tests.helpers.tiny_model import make_wide_gguf

NUM_STREAMS = 4
CONTEXT = 2048
NUM_KV_BLOCKS = NUM_STREAMS * CONTEXT // 16
# The streams must outlast several of the page's once-a-second updates wherever the test runs: on the shared
# server's 2-layer model, 240 tokens (all its 64 blocks hold for 4 streams) took 0.6 s once its steps were captured,
# and the page never showed the 4. Here they would take tens of seconds; the test closes them long before.
BODY = {"model": MODEL_NAME, "max_tokens": 1900, "ignore_eos": True, "temperature": 0, "stream": True}
PAGE_STATE = """JSON.stringify({
  running: document.getElementById("running").textContent,
  kvUsed: document.getElementById("kv-used").textContent,
  kvTotal: document.getElementById("kv-total").textContent,
  usedBarPercent: parseFloat(document.querySelector("#kv-bar .used").style.width || "0"),
  batchRows: [...document.querySelectorAll("#batch tr")].map((tr) => [...tr.cells].map((td) => td.textContent)),
  status: document.getElementById("status").textContent})"""


def hold_stream(url: str, prompt: str, started: threading.Semaphore, stop: threading.Event) -> None:
    with httpx.stream("POST", url + "/v1/completions", json={**BODY, "prompt": prompt}, timeout=REQUEST_TIMEOUT_S) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                started.release()
                break
        for _ in lines:  # leaving the block closes the connection: the server aborts the request
            if stop.is_set():
                return


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """Overrides conftest's model for this module's server: a step takes milliseconds, not tens of microseconds."""
    return make_wide_gguf(tmp_path_factory.mktemp("model") / "wide.gguf", context=CONTEXT)


def test_the_dashboard_shows_the_running_batch_in_a_browser(server_factory, tmp_path):
    server = server_factory("--num-kv-blocks", str(NUM_KV_BLOCKS))
    with HeadlessChromium(tmp_path / "chromium") as browser:
        browser.open(server.url + "/dashboard")

        def page():
            return json.loads(browser.evaluate(PAGE_STATE))

        assert wait_until(lambda: page()["status"] == "live" and page()["running"] == "0", 30), page()
        started, stop = threading.Semaphore(0), threading.Event()
        streams = [threading.Thread(target=hold_stream, args=(server.url, f"Stream {i} tells a story", started, stop))
                   for i in range(NUM_STREAMS)]
        for thread in streams:
            thread.start()
        try:
            for _ in range(NUM_STREAMS):
                assert started.acquire(timeout=REQUEST_TIMEOUT_S), "a stream never started"
            assert wait_until(lambda: page()["running"] == str(NUM_STREAMS), 30), page()
            busy = page()
            screenshot = browser.screenshot(tmp_path / "dashboard.png")
        finally:
            stop.set()
            for thread in streams:
                thread.join(REQUEST_TIMEOUT_S)
        assert int(busy["kvUsed"]) > 0 and busy["usedBarPercent"] > 0 and int(busy["kvTotal"]) == NUM_KV_BLOCKS, busy
        assert len(busy["batchRows"]) == NUM_STREAMS, busy
        assert all(int(prompt) > 0 and int(blocks) > 0 for _, prompt, _, blocks in busy["batchRows"]), busy
        assert screenshot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        print(f"dashboard screenshot: {screenshot}")

        assert wait_until(lambda: page()["running"] == "0" and page()["kvUsed"] == "0", 30), page()
        idle = page()
        assert idle["batchRows"] == [] and idle["usedBarPercent"] == 0, idle
