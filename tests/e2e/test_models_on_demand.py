"""`tinyvllm serve --models-dir` without --model: two tiny models in a store, each loaded by the first request that
names it (its own server, scheduler and worker appear), unloaded by keep_alive 0, by its keep_alive running out or
to make room (--max-loaded-models 1: the idle one goes, never the busy one), with /api/ps telling the processes'
truth at each step, through the official ollama and openai clients."""
from __future__ import annotations

import json
import os
import threading
import time

import httpx
import ollama
import openai
import pytest

from tests.e2e.server_process import ServerProcess, cmdline, descendants, wait_until
from tests.helpers.tiny_model import make_tiny_gguf

ON_DEMAND_DEFAULTS = ("--num-kv-blocks", "64", "--max-num-seqs", "16", "--no-jit-warmup")
MODEL_SERVER = "tinyvllm.frontend.api.server"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("on-demand")
    return folder, make_tiny_gguf(folder / "a.gguf", seed=0), make_tiny_gguf(folder / "b.gguf", seed=1)


@pytest.fixture(scope="module")
def switch(store):
    folder, a, b = store
    server = ServerProcess(None, folder / "server.log", *ON_DEMAND_DEFAULTS, "--models-dir", str(folder / "models"),
                           "--max-loaded-models", "1", defaults=())
    try:
        server.wait_ready()
        client = ollama.Client(host=server.url)
        client.create(model="alpha", from_=str(a))  # through /api/create, which needs no engine
        client.create(model="beta", from_=str(b))
        yield server
    finally:
        left = server.stop()
    assert not left, f"processes were left running: {server.leftover_description}"


def model_servers(switch: ServerProcess) -> dict[int, str]:
    """pid -> the model each running model server serves, from its command line."""
    found = {}
    for pid in descendants(switch.pid):
        line = cmdline(pid)
        if MODEL_SERVER in line:
            found[pid] = json.loads(line.split(MODEL_SERVER, 1)[1].strip())[1]["served_model_name"]
    return found


def engine_processes(switch: ServerProcess) -> list[int]:
    return [pid for pid in descendants(switch.pid) if "tinyvllm.scheduler.main" in cmdline(pid)
            or "tinyvllm.workers.main" in cmdline(pid)]


def ps_names(switch: ServerProcess) -> list[str]:
    return sorted(m["name"] for m in httpx.get(f"{switch.url}/api/ps").json()["models"])


def unload_all(switch: ServerProcess) -> None:
    for name in ("alpha", "beta"):
        httpx.post(f"{switch.url}/models/unload", json={"model": name})
    assert wait_until(lambda: not model_servers(switch) and not engine_processes(switch), 30), \
        model_servers(switch)


def test_requests_load_models_and_keep_alive_zero_ends_their_processes(switch):
    unload_all(switch)
    assert ps_names(switch) == []
    models = {m["id"]: m["status"]["value"] for m in httpx.get(f"{switch.url}/v1/models").json()["data"]}
    assert models == {"alpha": "unloaded", "beta": "unloaded"}

    # four requests arrive while alpha loads: all of them are answered by the one server it starts
    openai_client = openai.OpenAI(base_url=f"{switch.url}/v1", api_key="unused")
    replies = [None] * 4

    def ask(i):
        replies[i] = openai_client.completions.create(model="alpha", prompt=f"Hello {i}", max_tokens=4)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(r is not None and r.choices[0].finish_reason == "length" and r.model == "alpha" for r in replies)
    assert list(model_servers(switch).values()) == ["alpha"]
    assert len(engine_processes(switch)) == 2  # its scheduler and worker
    assert ps_names(switch) == ["alpha:latest"]
    assert "model_name=\"alpha\"" in httpx.get(f"{switch.url}/metrics").text

    # the official client, unmodified: ps, then generate with keep_alive 0 ends the model's processes
    client = ollama.Client(host=switch.url)
    assert [m.model for m in client.ps().models] == ["alpha:latest"]
    pids = set(model_servers(switch)) | set(engine_processes(switch))
    reply = client.generate(model="alpha", prompt="Hi", options={"num_predict": 3}, keep_alive=0)
    assert reply.done and reply.eval_count == 3
    assert wait_until(lambda: not (pids & set(descendants(switch.pid))), 30), "alpha's processes did not end"
    assert client.ps().models == []
    # unloading a model that is not loaded answers at once and starts nothing
    assert client.generate(model="beta", prompt="", keep_alive=0).done_reason == "unload"
    assert model_servers(switch) == {}


def test_the_least_recently_used_idle_model_makes_room_never_a_busy_one(switch):
    unload_all(switch)
    url = switch.url
    assert httpx.post(f"{url}/models/load", json={"model": "alpha"}, timeout=120).json() == {"success": True}
    alpha_pids = set(model_servers(switch))
    # beta needs alpha's place (--max-loaded-models 1) while alpha streams: beta waits until alpha is idle
    events, beta_reply = [], {}
    with httpx.stream("POST", f"{url}/v1/completions", timeout=120, json={
            "model": "alpha", "prompt": "Once", "max_tokens": 300, "ignore_eos": True, "stream": True}) as stream:
        chunks = stream.iter_lines()
        next(line for line in chunks if line.startswith("data: {"))

        def ask_beta():
            beta_reply["body"] = httpx.post(f"{url}/api/generate", timeout=120, json={
                "model": "beta", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}}).json()
            beta_reply["at"] = time.monotonic()

        beta = threading.Thread(target=ask_beta)
        beta.start()
        for line in chunks:
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
            assert set(model_servers(switch)) >= alpha_pids or line == "data: [DONE]", "alpha stopped while busy"
        alpha_done = time.monotonic()
    beta.join(120)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert beta_reply["body"]["done"] and beta_reply["at"] >= alpha_done - 0.5
    assert wait_until(lambda: list(model_servers(switch).values()) == ["beta"], 30), model_servers(switch)
    assert ps_names(switch) == ["beta:latest"]
    statuses = {m["id"]: m["status"]["value"] for m in httpx.get(f"{url}/v1/models").json()["data"]}
    assert statuses == {"alpha": "unloaded", "beta": "loaded"}


def test_a_model_unloads_when_its_keep_alive_runs_out(switch):
    unload_all(switch)
    reply = httpx.post(f"{switch.url}/api/chat", timeout=120, json={
        "model": "alpha", "messages": [{"role": "user", "content": "Hi"}], "stream": False, "keep_alive": "2s",
        "options": {"num_predict": 2}}).json()
    assert reply["done"]
    expires = httpx.get(f"{switch.url}/api/ps").json()["models"][0]["expires_at"]
    assert expires.endswith("Z") and not expires.startswith("2318")
    assert model_servers(switch)
    assert wait_until(lambda: not model_servers(switch) and ps_names(switch) == [], 30)


def test_bad_requests_get_the_apis_own_errors(switch):
    url = switch.url
    missing = httpx.post(f"{url}/v1/chat/completions", json={"model": "nope", "messages": []})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    assert httpx.post(f"{url}/api/generate", json={"model": "nope"}).json() == \
        {"error": 'model "nope" not found, try pulling it first'}
    assert httpx.post(f"{url}/api/chat", json={"messages": []}).json() == {"error": "model is required"}
    bad = httpx.post(f"{url}/api/generate", json={"model": "alpha", "keep_alive": "5x"})
    assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]
    assert httpx.post(f"{url}/models/load", json={"model": "nope"}).status_code == 404
    assert httpx.post(f"{url}/models/unload", json={"model": "nope"}).status_code == 400  # not loaded
    assert httpx.post(f"{url}/v1/completions", content=b"{not json").status_code == 400
    assert model_servers(switch) == {} or set(model_servers(switch).values()) <= {"alpha", "beta"}


def test_a_stored_model_with_an_adapter_runs_it_on_every_route(switch, store, tmp_path):
    """A model made FROM alpha's weights with a Modelfile ADAPTER: its own server enables LoRA, and OpenAI and
    Ollama requests naming it both run with the adapter (unlike alpha's)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from tests.helpers.tiny_lora import with_adapter
    from tests.helpers.tiny_model import VOCAB_SIZE
    _, a, _ = store
    base = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=128))
    with_adapter(base, tmp_path / "adapter", 3, r=8, lora_alpha=32, target_modules=["q_proj", "v_proj", "down_proj"])
    created = httpx.post(f"{switch.url}/api/create", timeout=60, json={
        "model": "gamma", "from": str(a), "modelfile": f"ADAPTER {tmp_path / 'adapter'}", "stream": False})
    assert created.status_code == 200, created.text
    openai_client = openai.OpenAI(base_url=f"{switch.url}/v1", api_key="unused")
    ask = lambda model: openai_client.completions.create(model=model, prompt="Once upon", max_tokens=6,
                                                         temperature=0, extra_body={"ignore_eos": True})
    tuned = ask("gamma").choices[0].text
    reply = ollama.Client(host=switch.url).generate(model="gamma", prompt="Once upon", raw=True,
                                                    options={"temperature": 0, "num_predict": 6})
    assert reply.response == tuned
    assert ask("alpha").choices[0].text != tuned


def test_stopping_the_server_stops_every_models_processes(switch):
    """(Last: it stops the module's server.)"""
    assert httpx.post(f"{switch.url}/models/load", json={"model": "beta"}, timeout=120).status_code == 200
    pids = set(model_servers(switch)) | set(engine_processes(switch))
    assert len(pids) == 3
    assert switch.signal_and_wait(15, 60) is not None, "the server did not exit on SIGTERM" + switch.log_tail()
    assert switch.proc.returncode == 0
    assert wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids), 10), pids
