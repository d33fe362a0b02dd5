"""Ollama's model routes through the ASGI app: tags, show, ps, copy, delete, create, blobs, pull; /v1/models."""
import hashlib

import pytest

from app_harness import MODEL
from ollama_harness import SERVED, make_ollama_app, parse_ndjson, write_small_gguf

pytestmark = pytest.mark.anyio


@pytest.fixture
def weights(tmp_path):
    """(the served GGUF, another model's GGUF)"""
    return write_small_gguf(tmp_path / "served.gguf"), write_small_gguf(tmp_path / "other.gguf", seed=1)


@pytest.fixture
def served(tmp_path, weights):
    return make_ollama_app(tmp_path, model_root=str(weights[0]))


async def names(client) -> list[str]:
    return [m["name"] for m in (await client.get("/api/tags")).json()["models"]]


async def generate(client, model: str):
    return await client.post("/api/generate", json={"model": model, "prompt": "Hi", "stream": False})


async def test_root_version_and_head(served):
    client, _, _ = served
    r = await client.get("/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert (await client.head("/")).status_code == 200
    assert (await client.head("/api/tags")).status_code == 200
    assert set((await client.get("/api/version")).json()) == {"version"}


async def test_tags_show_and_ps_describe_the_served_model(served, weights):
    client, _, _ = served
    (model,) = (await client.get("/api/tags")).json()["models"]
    assert model["name"] == model["model"] == SERVED and model["size"] == weights[0].stat().st_size
    assert len(model["digest"]) == 64 and model["modified_at"].endswith("Z")
    assert model["details"] == {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
                                "parameter_size": "2.1K", "quantization_level": "F16"}
    show = (await client.post("/api/show", json={"model": MODEL})).json()
    assert show["details"] == model["details"] and show["capabilities"] == ["completion"]
    assert show["model_info"]["llama.context_length"] == 128 and show["model_info"]["tokenizer.ggml.tokens"] == []
    assert f"FROM {weights[0]}" in show["modelfile"] and show["parameters"] == ""
    verbose = (await client.post("/api/show", json={"model": MODEL, "verbose": True})).json()
    assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) == 64
    (running,) = (await client.get("/api/ps")).json()["models"]
    assert running["name"] == SERVED and running["digest"] == model["digest"] and running["context_length"] == 256
    assert running["size_vram"] == running["size"]  # the fake engine names no device
    assert (await client.post("/api/show", json={"model": "nope"})).json() == {"error": "model 'nope' not found"}


@pytest.mark.parametrize("device, on_gpu", [("CPU", False), ("CUDA", True), ("NV", True), ("", True)])
def test_ps_counts_vram_only_off_the_cpu(device, on_gpu):
    from tinyvllm.frontend.api.ollama.model_routes import vram_bytes
    from tinyvllm.protocol.messages import EngineReady

    class Engine:
        ready = EngineReady(8, 16, 256, 4, 1, [], "float32", device)
    assert vram_bytes(Engine(), 1234) == (1234 if on_gpu else 0)


async def test_copy_generate_and_delete(served):
    client, engine, _ = served
    assert (await client.post("/api/copy", json={"source": MODEL, "destination": "backup"})).status_code == 200
    assert await names(client) == [SERVED, "backup:latest"]
    ids = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
    assert ids == [MODEL, "backup"]
    assert (await generate(client, "backup")).json()["response"]
    assert (await client.request("DELETE", "/api/delete", json={"model": "backup"})).status_code == 200
    assert await names(client) == [SERVED]
    gone = await client.request("DELETE", "/api/delete", json={"model": "backup"})
    assert gone.status_code == 404 and gone.json() == {"error": "model 'backup' not found"}
    served_delete = await client.request("DELETE", "/api/delete", json={"model": MODEL})
    assert served_delete.status_code == 400 and "this server runs" in served_delete.json()["error"]
    assert (await client.post("/api/copy", json={"source": "nope", "destination": "x"})).status_code == 404
    assert (await client.post("/api/copy", json={"source": MODEL, "destination": "bad name!"})).status_code == 400


async def test_create_from_a_modelfile_applies_parameters_and_system(served):
    client, engine, tok = served
    modelfile = f'FROM {MODEL}\nPARAMETER temperature 0.2\nPARAMETER stop "xx"\nPARAMETER stop yy\n' \
                'SYSTEM """You are\na pirate."""\n'
    r = await client.post("/api/create", json={"model": "pirate", "modelfile": modelfile})
    statuses = [line["status"] for line in parse_ndjson(r)]
    assert statuses[0].startswith("using existing layer sha256:") and statuses[-2:] == ["writing manifest", "success"]
    show = (await client.post("/api/show", json={"model": "pirate:latest"})).json()
    assert show["system"] == "You are\na pirate." and show["details"]["parent_model"] == SERVED
    assert show["parameters"].split("\n") == [f"{'temperature':<30} 0.2", f"{'stop':<30} \"xx\"",
                                              f"{'stop':<30} \"yy\""]
    assert (await generate(client, "pirate")).status_code == 200
    req = next(iter(engine.requests.values()))
    assert req.sampling.temperature == 0.2
    assert tok.decode(req.prompt_token_ids).startswith("<system>You are\na pirate.\n<user>Hi")


async def test_create_with_json_fields_and_template(served):
    client, engine, tok = served
    r = await client.post("/api/create", json={"model": "templated", "from": MODEL, "stream": False,
                                               "system": "S", "parameters": {"top_k": 3, "stop": ["q"]},
                                               "template": "[{{ .System }}] {{ .Prompt }} =>"})
    assert r.json() == {"status": "success"}
    assert (await generate(client, "templated")).status_code == 200
    req = next(iter(engine.requests.values()))
    assert req.sampling.top_k == 3 and req.prompt_token_ids == tok.encode("[S] Hi =>")
    assert "templated" in [m["id"] for m in (await client.get("/v1/models")).json()["data"]]


async def test_a_model_with_other_weights_is_listed_but_not_served(served, weights):
    client, engine, _ = served
    r = await client.post("/api/create", json={"model": "other", "from": str(weights[1]), "stream": False})
    assert r.status_code == 200
    assert await names(client) == [SERVED, "other:latest"]
    refused = await generate(client, "other")
    assert refused.status_code == 400 and f"serves only '{SERVED}'" in refused.json()["error"]
    assert (await client.post("/api/show", json={"model": "other"})).json()["details"]["format"] == "gguf"
    assert not engine.requests


async def test_blob_upload_then_create_from_files(served, weights, tmp_path):
    client, _, _ = served
    data = weights[0].read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert (await client.head(f"/api/blobs/{digest}")).status_code == 404
    wrong = await client.post("/api/blobs/sha256:" + "0" * 64, content=data)
    assert wrong.status_code == 400 and "digest mismatch" in wrong.json()["error"]
    assert (await client.post(f"/api/blobs/{digest}", content=data)).status_code == 201
    assert (await client.head(f"/api/blobs/{digest}")).status_code == 200
    r = await client.post("/api/create", json={"model": "uploaded", "files": {"m.gguf": digest}, "stream": False})
    assert r.status_code == 200, r.text
    tag = next(m for m in (await client.get("/api/tags")).json()["models"] if m["name"] == "uploaded:latest")
    assert tag["digest"] == digest[len("sha256:"):]
    assert (await generate(client, "uploaded")).status_code == 200  # the same bytes as the served weights
    assert (await client.request("DELETE", "/api/delete", json={"model": "uploaded"})).status_code == 200
    assert not list((tmp_path / "models" / "folders").iterdir())  # the assembled folder goes with its last model


async def test_blob_upload_is_bounded(served, monkeypatch):
    from tinyvllm.frontend.api.ollama import create_routes
    client, _, _ = served
    monkeypatch.setattr(create_routes, "MAX_BLOB_BYTES", 1000)
    data = b"x" * 1001
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = await client.post(f"/api/blobs/{digest}", content=data)
    assert r.status_code == 413 and "too large" in r.json()["error"]

    async def chunks():  # no Content-Length: counted while streaming
        yield data[:600]
        yield data[600:]
    r = await client.post(f"/api/blobs/{digest}", content=chunks())
    assert r.status_code == 413 and "too large" in r.json()["error"]
    assert (await client.head(f"/api/blobs/{digest}")).status_code == 404


@pytest.mark.parametrize("body,status,fragment", [
    ({"model": "x"}, 400, "neither 'from' nor 'files'"),
    ({"model": "x", "from": "missing-model"}, 404, "not found"),
    ({"model": "x", "modelfile": "FROM tiny\nWHATEVER 1"}, 400, "unknown Modelfile command"),
    ({"model": "x", "modelfile": f"FROM {MODEL}\nPARAMETER colour 3"}, 400, "unknown parameter 'colour'"),
    ({"model": "x", "modelfile": f"FROM {MODEL}\nADAPTER ./lora"}, 400, "this server runs none (serve --enable-lora)"),
    ({"model": "x", "from": MODEL, "quantize": "q4_K_M"}, 400, "quantize"),
    ({"model": "x", "from": MODEL, "parameters": {"temperature": "warm"}}, 400, "temperature"),
    ({"model": "x", "from": MODEL, "template": "{{ call .Foo }}"}, 400, "unsupported template"),
    ({"model": "x", "files": {"m.gguf": "sha256:" + "1" * 64}}, 400, "was not uploaded"),
    ({"model": MODEL, "from": MODEL}, 400, "this server runs"),
    ({"model": "bad name", "from": MODEL}, 400, "invalid model name"),
])
async def test_create_errors(served, body, status, fragment):
    client, _, _ = served
    r = await client.post("/api/create", json=body)
    assert r.status_code == status and fragment in r.json()["error"], r.text


async def test_pull_from_what_is_local(served, weights):
    client, _, _ = served
    lines = parse_ndjson(await client.post("/api/pull", json={"model": MODEL}))
    assert lines[0] == {"status": "pulling manifest"} and lines[-1] == {"status": "success"}
    assert lines[1]["total"] == lines[1]["completed"] == weights[0].stat().st_size
    r = await client.post("/api/pull", json={"model": str(weights[1]), "stream": False})
    assert r.json() == {"status": "success"} and "other:latest" in await names(client)
    missing = await client.post("/api/pull", json={"model": "llama3.2"})
    assert missing.status_code == 404 and "does not download" in missing.json()["error"]


async def test_without_a_models_folder_only_the_served_model_exists():
    client, _, _ = make_ollama_app(None)
    assert await names(client) == [SERVED]
    r = await client.post("/api/copy", json={"source": MODEL, "destination": "x"})
    assert r.status_code == 400 and "--models-dir" in r.json()["error"]
    assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == [MODEL]


async def test_embeddings(served, monkeypatch):
    from tinyvllm.frontend.engine import embeddings
    client, engine, _ = served
    seen = []

    async def embed(engine_, token_id_lists):
        seen.append(engine_)
        return [[3.0, 4.0, float(len(ids))] for ids in token_id_lists]

    monkeypatch.setattr(embeddings, "embed", embed)
    body = (await client.post("/api/embed", json={"model": MODEL, "input": ["Hi", "Hey"], "dimensions": 2})).json()
    assert body["embeddings"] == [[0.6, 0.8], [0.6, 0.8]] and body["prompt_eval_count"] == 7
    legacy = (await client.post("/api/embeddings", json={"model": MODEL, "prompt": "Hi"})).json()
    # behind the request gate (ServedEngine)
    assert legacy == {"embedding": [3.0, 4.0, 3.0]} and seen[0].engine is engine
    assert (await client.post("/api/embed", json={"model": "nope", "input": "x"})).status_code == 404
    too_long = await client.post("/api/embed", json={"model": MODEL, "input": "x" * 300, "truncate": False})
    assert too_long.status_code == 400 and "context length" in too_long.json()["error"]
    monkeypatch.delattr(embeddings, "embed")
    r = await client.post("/api/embed", json={"model": MODEL, "input": "Hi"})
    assert r.status_code == 501 and "embeddings are not available" in r.json()["error"]


async def test_embeddings_engine_failure(tmp_path):
    client, _, _ = make_ollama_app(tmp_path, fail_after=0)  # the engine ends the request with an error
    r = await client.post("/api/embed", json={"model": MODEL, "input": "Hi"})
    assert r.status_code == 500 and "could not compute the embeddings" in r.json()["error"]


def test_a_stored_model_served_under_its_own_name_keeps_its_parameters_and_system(tmp_path, weights):
    """How `serve --models-dir` starts a stored model's server: --served-model-name is the stored name."""
    from tinyvllm.frontend.api.ollama.model_store import ModelEntry, ModelStore
    folder = tmp_path / "store"
    ModelStore(folder, None, None, 0).put(ModelEntry("tuned:latest", str(weights[0].resolve()),
                                                     parameters={"temperature": 0.1}, system="Be brief."))
    served = ModelStore(folder, "tuned", str(weights[0]), 512)
    assert served.served.system == "Be brief." and served.served.parameters == {"temperature": 0.1}
    assert served.get("tuned:latest") is served.served and [e.name for e in served.list()] == ["tuned:latest"]
    other = ModelStore(folder, "tuned", str(weights[1]), 512)  # other weights: the manifest is not this model's
    assert other.served.system is None and other.served.parameters == {}


def test_a_store_without_a_served_model_lists_and_refuses_only_by_what_is_stored(tmp_path, weights):
    from tinyvllm.frontend.api.ollama.model_store import ModelEntry, ModelStore
    store = ModelStore(tmp_path / "store", None, None, 0)
    assert store.list() == [] and store.get("anything") is None
    store.put(ModelEntry("a:latest", str(weights[0])))
    assert [e.name for e in store.list()] == ["a:latest"] and not store.uses_served_weights(store.get("a"))
    assert store.remove("a") and store.list() == []
