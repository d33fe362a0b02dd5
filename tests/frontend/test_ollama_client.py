"""The official `ollama` Python client, unmodified, against the ASGI app and the fake engine."""
import httpx
import ollama
import pytest

from app_harness import MODEL, REPLY
from ollama_harness import SERVED, build_ollama_app, write_small_gguf

pytestmark = pytest.mark.anyio


@pytest.fixture
def client(tmp_path):
    app, _, _ = build_ollama_app(tmp_path, model_root=str(write_small_gguf(tmp_path / "served.gguf")))
    return ollama.AsyncClient(host="http://test", transport=httpx.ASGITransport(app))


async def test_client_generate_chat_and_model_routes(client):
    reply = await client.generate(model=MODEL, prompt="Hi", options={"temperature": 0, "num_predict": 32})
    assert reply.response == REPLY and reply.done and reply.done_reason == "stop" and reply.context
    pieces = [p async for p in await client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 stream=True)]
    assert "".join(p.message.content for p in pieces) == REPLY and pieces[-1].eval_count == len(REPLY) + 1
    assert [m.model for m in (await client.list()).models] == [SERVED]
    shown = await client.show(MODEL)
    assert shown.details.family == "llama" and shown.modelinfo["general.architecture"] == "llama"
    assert (await client.ps()).models[0].context_length == 256
    assert (await client.copy(MODEL, "copied")).status == "success"
    created = await client.create(model="sys", from_=MODEL, system="Be terse.", parameters={"temperature": 0.1})
    assert created.status == "success"
    assert (await client.generate(model="sys", prompt="Hi")).response == REPLY
    assert (await client.delete("copied")).status == "success"
    assert [m.model for m in (await client.list()).models] == [SERVED, "sys:latest"]
    assert (await client.pull(MODEL)).status == "success"
    with pytest.raises(ollama.ResponseError) as e:
        await client.generate(model="missing", prompt="Hi")
    assert e.value.status_code == 404 and "not found" in e.value.error
