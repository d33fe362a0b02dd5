"""/metrics after a mixed load on the real server: it parses as Prometheus text, and its counters move by exactly
what the clients counted.

The load runs concurrently: completions and chat, streamed and not, n=2, prompts as token ids, streams the client
abandons after two chunks (aborted by disconnect), and bad requests (which must count nothing). Each client tallies
prompt tokens (from usage, or from /tokenize for the abandoned ones), generated tokens (from usage; for abandoned
streams only bounds are known) and finished choices by finish reason.
"""
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.http_helpers import chat_body, completion_body, stream
from tests.e2e.server_process import MODEL_NAME, REQUEST_TIMEOUT_S, engine_idle, wait_until

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
ABANDONED_MAX_TOKENS = 400
COUNTERS = ["vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success", "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits", "vllm:num_preemptions"]
GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
HISTOGRAMS = ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_prompt_tokens",
              "vllm:request_generation_tokens", "vllm:request_params_n", "vllm:request_params_max_tokens"]


@dataclass
class Tally:
    engine_requests: int = 0  # requests that reached the engine
    prompt_tokens: int = 0
    generated_min: int = 0
    generated_max: int = 0
    finished: Counter = field(default_factory=Counter)

    def add(self, other: "Tally") -> None:
        self.engine_requests += other.engine_requests
        self.prompt_tokens += other.prompt_tokens
        self.generated_min += other.generated_min
        self.generated_max += other.generated_max
        self.finished.update(other.finished)


def scrape(url: str) -> tuple[dict, dict]:
    """({(sample name, sorted labels): value}, {family name: type}) of /metrics."""
    text = httpx.get(url + "/metrics", timeout=30).text
    families = list(text_string_to_metric_families(text))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    return samples, {f.name: f.type for f in families}


def prompt_count(url: str, path: str, body: dict) -> int:
    if isinstance(body.get("prompt"), list):
        return len(body["prompt"])
    form = {"messages": body["messages"]} if path == CHAT else {"prompt": body["prompt"]}
    r = httpx.post(url + "/tokenize", json={"model": MODEL_NAME, **form}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["count"]


def completed(url: str, path: str, body: dict) -> Tally:
    if body.get("stream"):
        result = stream(url, path, {**body, "stream_options": {"include_usage": True}})
        assert result.status == 200 and result.done and not result.errors, result.events
        usage = next(e["usage"] for e in result.events if isinstance(e, dict) and e.get("usage"))
        reasons = [c["finish_reason"] for e in result.events if isinstance(e, dict)
                   for c in e.get("choices", []) if c.get("finish_reason")]
    else:
        r = httpx.post(url + path, json=body, timeout=REQUEST_TIMEOUT_S)
        assert r.status_code == 200, r.text
        usage, reasons = r.json()["usage"], [c["finish_reason"] for c in r.json()["choices"]]
    assert len(reasons) == body.get("n", 1), reasons
    assert usage["prompt_tokens"] == prompt_count(url, path, body)  # /tokenize agrees with generation
    generated = usage["completion_tokens"]
    return Tally(1, usage["prompt_tokens"], generated, generated, Counter(reasons))


def abandoned(url: str, path: str, body: dict) -> Tally:
    """Reads two content chunks of a long stream, then closes the connection."""
    body = {**body, "stream": True, "max_tokens": ABANDONED_MAX_TOKENS, "ignore_eos": True}
    chunks = 0
    with httpx.stream("POST", url + path, json=body, timeout=REQUEST_TIMEOUT_S) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[len("data: "):])["choices"][0]
                assert choice["finish_reason"] is None
                chunks += bool(choice.get("text") or choice.get("delta", {}).get("content"))
                if chunks == 2:
                    break
    # each content chunk carries at least one token; the request was aborted before its last one
    return Tally(1, prompt_count(url, path, body), chunks, ABANDONED_MAX_TOKENS - 1, Counter(abort=1))


def rejected(url: str, path: str, body) -> Tally:
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body}
    assert httpx.post(url + path, timeout=60, **kwargs).status_code in (400, 404)
    return Tally()


def load(url: str) -> list:
    jobs = [
        (completed, COMPLETIONS, completion_body("The capital of France is", max_tokens=8, temperature=0)),
        (completed, COMPLETIONS, completion_body("Once upon a time", max_tokens=6, stream=True)),
        (completed, COMPLETIONS, completion_body([1, 2, 3, 400, 5000], max_tokens=5, ignore_eos=True)),
        (completed, COMPLETIONS, completion_body("Count: one, two,", max_tokens=4, n=2, seed=7)),
        (completed, CHAT, chat_body("Hello there!", max_tokens=6, temperature=0)),
        (completed, CHAT, chat_body("Tell me a story", max_tokens=7, stream=True, ignore_eos=True)),
        (completed, CHAT, chat_body("Two answers please", max_tokens=3, n=2, stream=True)),
        (abandoned, COMPLETIONS, completion_body("The history of the world, part")),
        (abandoned, CHAT, chat_body("Write a very long essay")),
        (rejected, COMPLETIONS, b'{"prompt": "hi", '),
        (rejected, CHAT, {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}),
        (rejected, COMPLETIONS, completion_body("hello " * 600, max_tokens=4)),
        (rejected, CHAT, chat_body("hi", max_tokens=0, stream=True)),
    ]
    return [(fn, url, path, body) for fn, path, body in jobs]


def delta(after: dict, before: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted({"model_name": MODEL_NAME, **labels}.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_counters_match_what_the_clients_counted(server):
    before, _ = scrape(server.url)
    with ThreadPoolExecutor(max_workers=6) as pool:
        tallies = list(pool.map(lambda job: job[0](*job[1:]), load(server.url)))
    expected = Tally()
    for tally in tallies:
        expected.add(tally)
    assert wait_until(lambda: engine_idle(server.url), 30)
    # the abandoned streams' handlers finish (and count) once the server notices the closed connections
    assert wait_until(lambda: delta(scrape(server.url)[0], before, "vllm:request_success_total",
                                    finished_reason="abort") == expected.finished["abort"], 10)
    after, types = scrape(server.url)

    assert delta(after, before, "vllm:prompt_tokens_total") == expected.prompt_tokens
    generated = delta(after, before, "vllm:generation_tokens_total")
    assert expected.generated_min <= generated <= expected.generated_max, (generated, expected)
    for reason in ("stop", "length", "abort", "error"):
        assert delta(after, before, "vllm:request_success_total", finished_reason=reason) == \
            expected.finished[reason], reason
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                      "vllm:request_prompt_tokens", "vllm:request_params_n"):
        assert delta(after, before, histogram + "_count") == expected.engine_requests, histogram
    assert delta(after, before, "vllm:request_prompt_tokens_sum") == expected.prompt_tokens
    assert delta(after, before, "vllm:inter_token_latency_seconds_count") > 0

    for name in COUNTERS:
        assert types[name] == "counter", name
    for name in GAUGES:
        assert types[name] == "gauge", name
    for name in HISTOGRAMS:
        assert types[name] == "histogram", name
