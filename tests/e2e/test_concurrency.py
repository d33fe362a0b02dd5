"""16 concurrent streamed requests through the real server are batched together and each gives exactly the
text it gives alone; afterwards the engine reports nothing running and an empty KV cache."""
import threading
from concurrent.futures import ThreadPoolExecutor

from tests.e2e.http_helpers import chat_body, complete, completion_body, stream
from tests.e2e.server_process import engine_idle, engine_load, read_metric, wait_until

TOPICS = ["the sea", "a red fox", "mountains", "coffee", "old trains", "a small robot", "winter", "jazz",
          "bees", "a lighthouse", "chess", "rain in Paris", "volcanoes", "a library", "the moon", "bread"]
# temperature 0: greedy, so "alone" is well defined; ignore_eos: every request decodes all its tokens, so they
# share many steps (and batch-size buckets) instead of some ending at once.
PARAMS = {"temperature": 0, "max_tokens": 10, "ignore_eos": True}


def requests() -> list[tuple[str, dict]]:
    reqs = []
    for i, topic in enumerate(TOPICS):
        if i % 2:
            reqs.append(("/v1/chat/completions", chat_body(f"Tell me about {topic}.", **PARAMS)))
        else:
            reqs.append(("/v1/completions", completion_body(f"Once upon a time, {topic}" + " and" * i, **PARAMS)))
    return reqs


def test_16_concurrent_streams_match_sequential_runs(server):
    reqs = requests()
    max_running, stop = [0.0], threading.Event()

    def monitor():  # proves the requests really ran in one batch
        while not stop.is_set():
            max_running[0] = max(max_running[0], read_metric(server.url, "vllm:num_requests_running"))
            stop.wait(0.1)

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(len(reqs)) as pool:
            streamed = list(pool.map(lambda r: stream(server.url, *r), reqs))
    finally:
        stop.set()
        watcher.join(30)

    for (path, body), res in zip(reqs, streamed):
        assert res.status == 200 and res.done and not res.errors, (path, body, res.events[-3:])
        assert res.finish_reason == "length", res.events[-3:]
    assert max_running[0] >= 2, f"the requests never ran together (max running {max_running[0]})"

    alone = [complete(server.url, path, {**body, "stream": False}) for path, body in reqs]
    for (path, body), res, (text, finish) in zip(reqs, streamed, alone):
        assert res.text == text, f"{path} {body}: concurrent {res.text!r} != alone {text!r}"
        assert res.finish_reason == finish
    assert len({text for text, _ in alone}) >= 12, f"the tiny model's outputs are not varied enough: {alone}"

    assert wait_until(lambda: engine_idle(server.url), 10), f"not idle afterwards: {engine_load(server.url)}"
    assert read_metric(server.url, "vllm:num_requests_running") == 0
    assert read_metric(server.url, "vllm:kv_cache_usage_perc") == 0
