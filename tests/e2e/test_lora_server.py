"""LoRA adapters through `tinyvllm serve --enable-lora --lora-modules` and the official openai client: an adapter is
a model of /v1/models, chosen by `model`; its greedy tokens and their logprobs equal transformers + peft's; adapters
load and unload at runtime through vLLM's routes (VLLM_ALLOW_RUNTIME_LORA_UPDATING), with vLLM's errors; /metrics has
vllm:lora_requests_info."""
import os

import httpx
import numpy as np
import openai
import pytest

from tests.e2e.server_process import MODEL_NAME, start_server
from tests.helpers.tiny_lora import greedy_reference, make_llama_with_adapters, write_lora_gguf
from tinyvllm.protocol.model_config import read_model_config
from tinyvllm.protocol.tokenizer import Tokenizer

PROMPT = list(range(200, 230))


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora-server")
    base_folder, adapters, base = make_llama_with_adapters(folder)
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "true"
    try:
        server = start_server(base_folder, folder / "server.log", "--enable-lora", "--max-loras", "2",
                              "--kernels", "c", "--lora-modules", f"small={adapters['small'][0]}")
    finally:
        del os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"]
    yield server, adapters, base, base_folder
    left = server.stop()
    assert not left, server.leftover_description


def test_served_adapters_equal_peft_and_load_and_unload_at_runtime(lora_server):
    server, adapters, base, base_folder = lora_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {MODEL_NAME, "small"} and models["small"].parent == MODEL_NAME

    tokenizer = Tokenizer.from_model_path(base_folder)

    def greedy(model: str):
        reply = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=0,
                                          extra_body={"ignore_eos": True})
        assert reply.model == model
        return reply.choices[0].text, reply.choices[0].logprobs.token_logprobs

    for name, model in (("small", adapters["small"][1]), (MODEL_NAME, base)):
        text, logprobs = greedy(name)
        expected_tokens, expected_logprobs = greedy_reference(model, PROMPT, 5)
        assert text == tokenizer.decode(expected_tokens)
        np.testing.assert_allclose(logprobs, expected_logprobs, rtol=1e-4, atol=1e-4)

    url = server.url
    loaded = httpx.post(f"{url}/v1/load_lora_adapter",
                        json={"lora_name": "wide", "lora_path": str(adapters["wide"][0])})
    assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'wide' added successfully."
    assert greedy("wide")[0] == tokenizer.decode(greedy_reference(adapters["wide"][1], PROMPT, 5)[0])
    again = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "wide", "lora_path": "x"})
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    bad = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "nowhere", "lora_path": str(server.log_path)})
    assert bad.status_code == 404 and "no PEFT LoRA adapter" in bad.json()["error"]["message"]
    assert 'running_lora_adapters=""' in httpx.get(f"{url}/metrics").text  # vllm:lora_requests_info, all idle

    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "wide"}).status_code == 200
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "wide"})
    assert gone.status_code == 404 and gone.json()["error"]["message"] == "The lora adapter 'wide' cannot be found."
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="wide", prompt="Hi", max_tokens=1)


def test_an_ollama_model_made_with_an_adapter_generates_as_that_adapter(lora_server):
    """Ollama's create with `adapters` (uploaded blobs of a PEFT folder), the official client unmodified: the
    model's replies are the adapter's, and its Modelfile names it."""
    import ollama
    server, adapters, _, base_folder = lora_server
    client = ollama.Client(host=server.url)
    folder = adapters["wide"][0]
    blobs = {f.name: client.create_blob(f) for f in sorted(folder.iterdir()) if f.suffix in (".json", ".safetensors")}
    client.create(model="tuned", from_=MODEL_NAME, adapters=blobs)
    assert "ADAPTER " in client.show("tuned").modelfile
    reply = client.generate(model="tuned", prompt="Once upon a time", raw=True,
                            options={"temperature": 0, "num_predict": 5})
    httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "wide", "lora_path": str(folder)})
    expected = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused").completions.create(
        model="wide", prompt="Once upon a time", max_tokens=5, temperature=0)
    assert reply.response == expected.choices[0].text and reply.eval_count == 5
    base = client.generate(model=MODEL_NAME, prompt="Once upon a time", raw=True,
                           options={"temperature": 0, "num_predict": 5})
    assert base.response != reply.response
    # the ollama CLI's ADAPTER ./x.gguf: one uploaded llama.cpp LoRA GGUF
    gguf = write_lora_gguf(adapters["small"][0], folder.parent / "small.gguf", read_model_config(base_folder), 16.0)
    client.create(model="tuned-gguf", from_=MODEL_NAME, adapters={"small.gguf": client.create_blob(gguf)})
    small = client.generate(model="tuned-gguf", prompt="Once upon a time", raw=True,
                            options={"temperature": 0, "num_predict": 5})
    assert small.response == openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused").completions.create(
        model="small", prompt="Once upon a time", max_tokens=5, temperature=0).choices[0].text
